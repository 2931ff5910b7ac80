"""Compile a TrialProgram to Z3, once per program version.

Each compiled program owns a Z3 context (so programs can be decided from different threads) and
one incremental solver holding the definitions as hard constraints plus guarded copies of the
requirements; a decision switches parts on and off with assumption literals instead of building
new solvers. Patient facts are assumption literals too (bool atoms directly, numeric facts through
a tracker added inside push/pop), so one compiled program serves many patients (warm regime).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import z3

from .formula import atoms_in, numeric_in_complex_terms, simple_comparisons
from .patient import Bounds, in_interval
from .program import Atom, Criterion, TrialProgram
from .smtlib import SORT, Writer, num, sym


@dataclass
class CompiledCriterion:
    index: int
    cohort: str
    side: str  # inclusion | exclusion
    criterion: Criterion
    requirement: z3.BoolRef  # inclusion: formula; exclusion: not formula
    indicator: z3.BoolRef  # indicator <=> requirement (assume it to require, its negation to refute)
    atoms: frozenset[str]
    cone: frozenset[str]  # atoms plus everything definitions connect them to

    @property
    def pos(self) -> z3.BoolRef:
        return self.indicator

    @cached_property
    def neg(self) -> z3.BoolRef:
        return z3.Not(self.indicator)

    @property
    def key(self) -> str:
        return f"{self.cohort}/{self.criterion.id}"


@dataclass
class Cell:
    """A region of a numeric atom on which every simple comparison in the program is constant."""

    lo: float | None
    hi: float | None
    lo_strict: bool
    hi_strict: bool
    guard: z3.BoolRef

    def contains(self, x: float) -> bool:
        return in_interval(self, x)

    def representative(self, integer: bool) -> float | int | None:
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None and lo == hi:
            v = lo
        elif lo is None and hi is None:
            v = 0.0
        elif lo is None:
            v = hi - 1
        elif hi is None:
            v = lo + 1
        else:
            v = (lo + hi) / 2
        if not integer:
            return v
        import math

        cands = [math.floor(v), math.ceil(v)]
        if lo is not None:
            cands.append(math.floor(lo) + 1 if self.lo_strict or not float(lo).is_integer() else int(lo))
        if hi is not None:
            cands.append(math.ceil(hi) - 1 if self.hi_strict or not float(hi).is_integer() else int(hi))
        for c in cands:
            if self.contains(c):
                return int(c)
        return None


@dataclass
class CompiledProgram:
    program: TrialProgram
    ctx: z3.Context
    vars: dict[str, z3.ExprRef]
    atoms: dict[str, Atom]
    definitions: list[tuple[str, z3.BoolRef, frozenset[str]]]
    criteria: list[CompiledCriterion]
    cohort_ids: list[str]
    cohort_guard: dict[str, z3.BoolRef]
    side_guard: dict[tuple[str, str], z3.BoolRef]
    phi_guard: z3.BoolRef
    cells: dict[str, list[Cell]]
    complex_numeric: frozenset[str]  # numeric atoms in nonlinear / multi-atom terms
    component: dict[str, frozenset[str]]  # atom -> atoms definitions connect it to
    solver: z3.Solver
    smt_text: str = ""  # the program as SMT-LIB, kept for baselines and debugging
    _settled: dict = field(default_factory=dict)
    _fact_exprs: dict = field(default_factory=dict)

    # Pure-atom formulas, built only when an artifact needs to substitute into them.
    @cached_property
    def aux(self) -> z3.BoolRef:
        return z3.And([e for _, e, _ in self.definitions]) if self.definitions else z3.BoolVal(True, self.ctx)

    @cached_property
    def cohort_req(self) -> dict[str, z3.BoolRef]:
        out = {}
        for cid in self.cohort_ids:
            reqs = [cc.requirement for cc in self.criteria if cc.cohort == cid]
            out[cid] = z3.And(reqs) if reqs else z3.BoolVal(True, self.ctx)
        return out

    @cached_property
    def phi_req(self) -> z3.BoolRef:
        """OR over cohorts of the cohort's requirements (definitions not included)."""
        return z3.Or(list(self.cohort_req.values()))

    @cached_property
    def _mentions(self) -> dict[str, tuple[list, list]]:
        out: dict[str, tuple[list, list]] = {a: ([], []) for a in self.atoms}
        for d in self.program.definitions:
            for a in atoms_in(d.formula):
                out[a][0].append(d.formula)
        for cc in self.criteria:
            for a in cc.atoms:
                out[a][1].append(cc)
        return out

    def mentions(self, atom: str) -> tuple[list, list]:
        """(definition formulas, compiled criteria) that mention the atom directly."""
        return self._mentions[atom]

    def settled(self, key: tuple, answer: Callable[[], Any]) -> Any:
        """What the program alone settles, asked once per program version: `answer()` on the first
        ask of `key`, the kept answer after (cached across patients)."""
        if key not in self._settled:
            self._settled[key] = answer()
        return self._settled[key]

    def settled_by_definitions(self, cc: CompiledCriterion, holds: bool, check) -> bool:
        """Do the definitions alone make the requirement hold (holds=True) or fail? Asked only
        for labels that need it, once per program version (cached across patients)."""
        return self.settled((cc.index, holds), lambda: not check(cc.neg if holds else cc.pos))

    def fact_expr(self, atom: str, value=None, bounds: Bounds | None = None) -> z3.BoolRef:
        """The constraint a resolved value puts on an atom, built once per program and value:
        the same facts recur across the patients screened against one trial."""
        key = (
            atom,
            type(value).__name__,
            value,
            None if bounds is None else (bounds.lo, bounds.hi, bounds.lo_strict, bounds.hi_strict),
        )
        expr = self._fact_exprs.get(key)
        if expr is None:
            if len(self._fact_exprs) > 50_000:  # bounded: numeric values vary without end
                self._fact_exprs.clear()
            expr = self._fact_exprs[key] = value_expr(self.vars[atom], value, bounds)
        return expr

    @property
    def content_hash(self) -> str:
        return self.program.content_hash or self.program.compute_hash()

    def cone(self, names) -> frozenset[str]:
        out: set[str] = set()
        for n in names:
            out |= self.component.get(n, frozenset([n]))
        return frozenset(out)


def compile_program(
    program: TrialProgram, timeout_ms: int = 2000, ctx: z3.Context | None = None
) -> CompiledProgram:
    """One SMT-LIB text for the whole program, parsed by Z3 in one call. Each criterion, side,
    cohort and numeric cell gets an indicator constant defined by an equivalence, so assumptions
    can switch it on (c) or off (not c) and `consequences` can read three-valued entailment."""
    ctx = ctx or z3.Context()
    text, crit_meta, cell_specs = _program_text(program)
    solver = z3.Solver(ctx=ctx)
    solver.set("timeout", timeout_ms)
    solver.from_string(text)  # parsed straight into the solver, no Python round trip per assertion
    parsed = solver.assertions()

    sorts = {"bool": z3.BoolSort(ctx), "int": z3.IntSort(ctx), "real": z3.RealSort(ctx)}
    zvars = {a.name: _const(ctx, a.name, sorts[a.domain]) for a in program.atoms}
    nd = len(program.definitions)
    defs = [(d.id, parsed[k], frozenset(atoms_in(d.formula))) for k, d in enumerate(program.definitions)]
    component = _components([a.name for a in program.atoms], [names for _, _, names in defs])
    lit = lambda name: _const(ctx, name, sorts["bool"])  # noqa: E731  (same name, same constant as in the text)
    return CompiledProgram(
        program=program,
        ctx=ctx,
        vars=zvars,
        atoms=program.atom_table(),
        definitions=defs,
        criteria=_compiled_criteria(crit_meta, parsed, nd, component),
        cohort_ids=[c.id for c in program.cohorts],
        cohort_guard={c.id: lit("!cohort:" + c.id) for c in program.cohorts},
        side_guard={
            (c.id, s): lit(f"!side:{c.id}:{s}") for c in program.cohorts for s in ("inclusion", "exclusion")
        },
        phi_guard=lit("!phi"),
        cells={
            name: [Cell(*span, lit(f"!cell:{name}:{k}")) for k, span in enumerate(spans)]
            for name, spans in cell_specs.items()
        },
        complex_numeric=frozenset(_complex_numeric(program)),
        component=component,
        solver=solver,
        smt_text=text,
    )


@dataclass
class _SmtText:
    """The program's SMT-LIB text as it is written: declarations first, then the assertions."""

    decls: list[str]
    body: list[str]

    def indicator(self, name: str, expr: str) -> None:
        """A Bool constant defined as equivalent to `expr`, so an assumption can switch `expr`."""
        self.decls.append(f"(declare-const {sym(name)} Bool)")
        self.body.append(f"(= {sym(name)} {expr})")

    def text(self) -> str:
        return "\n".join(self.decls + [f"(assert {b})" for b in self.body])


def _program_text(program: TrialProgram) -> tuple[str, list[tuple], dict[str, list[tuple]]]:
    """(SMT-LIB text, criteria in indicator order, numeric cells per atom): the atoms, the
    definitions (the first assertions, in order), then the criterion, side, cohort and cell
    indicators."""
    out = _SmtText([f"(declare-const {sym(a.name)} {SORT[a.domain]})" for a in program.atoms], [])
    w = Writer({a.name: a.domain for a in program.atoms})
    out.body += [w.formula(d.formula) for d in program.definitions]
    crit_meta, side_members = _criterion_indicators(program, w, out)
    _cohort_indicators(program, side_members, out)
    cell_specs = _cell_indicators(program, out)
    return out.text(), crit_meta, cell_specs


def _criterion_indicators(
    program: TrialProgram, w: Writer, out: _SmtText
) -> tuple[list[tuple], dict[tuple[str, str], list[str]]]:
    """One indicator per criterion (`!c<i>`: the formula on the inclusion side, its negation on
    the exclusion side). Returns (index, cohort, side, criterion) per indicator and the indicator
    names of each side."""
    crit_meta = []
    side_members: dict[tuple[str, str], list[str]] = {}
    for cohort in program.cohorts:
        for side in ("inclusion", "exclusion"):
            side_members[(cohort.id, side)] = []
            for cr in getattr(cohort, side):
                i = len(crit_meta)
                f = w.formula(cr.formula)
                out.indicator(f"!c{i}", f if side == "inclusion" else f"(not {f})")
                crit_meta.append((i, cohort.id, side, cr))
                side_members[(cohort.id, side)].append(sym(f"!c{i}"))
    return crit_meta, side_members


def _cohort_indicators(
    program: TrialProgram, side_members: dict[tuple[str, str], list[str]], out: _SmtText
) -> None:
    """An indicator per side (all its criteria), per cohort (both sides) and `!phi` (any cohort)."""
    for cohort in program.cohorts:
        parts = []
        for side in ("inclusion", "exclusion"):
            members = side_members[(cohort.id, side)]
            out.indicator(f"!side:{cohort.id}:{side}", _conj(members))
            parts += members
        out.indicator("!cohort:" + cohort.id, _conj(parts))
    cohorts = [sym("!cohort:" + c.id) for c in program.cohorts]
    out.indicator("!phi", cohorts[0] if len(cohorts) == 1 else "(or " + " ".join(cohorts) + ")")


def _cell_indicators(program: TrialProgram, out: _SmtText) -> dict[str, list[tuple]]:
    """An indicator per cell of each numeric atom: the spans between the thresholds the program
    compares it with. Returns the spans per atom."""
    thresholds: dict[str, set[float]] = {}
    for f in [d.formula for d in program.definitions] + [cr.formula for _, _, cr in program.criteria()]:
        for atom, _, c, _ in simple_comparisons(f):
            thresholds.setdefault(atom, set()).add(c)
    cell_specs: dict[str, list[tuple]] = {}
    for a in program.atoms:
        if a.domain == "bool":
            continue
        spans = _spans(sorted(thresholds.get(a.name, set())))
        cell_specs[a.name] = spans
        for k, span in enumerate(spans):
            out.indicator(f"!cell:{a.name}:{k}", _span_text(sym(a.name), SORT[a.domain], *span))
    return cell_specs


def _compiled_criteria(
    crit_meta: list[tuple], parsed: z3.AstVector, nd: int, component: dict[str, frozenset[str]]
) -> list[CompiledCriterion]:
    """Each criterion with its indicator and requirement, read off its parsed equivalence (the
    assertions after the `nd` definitions)."""
    criteria: list[CompiledCriterion] = []
    for i, cohort_id, side, cr in crit_meta:
        eq = parsed[nd + i]
        names = frozenset(atoms_in(cr.formula))
        criteria.append(
            CompiledCriterion(i, cohort_id, side, cr, eq.arg(1), eq.arg(0), names, _cone(component, names))
        )
    return criteria


def _const(ctx: z3.Context, name: str, sort: z3.SortRef) -> z3.ExprRef:
    """z3.Const without the Python-side checks (this is on the compile hot path)."""
    ast = z3.Z3_mk_const(ctx.ref(), z3.to_symbol(name, ctx), sort.ast)
    return (z3.BoolRef if sort.kind() == z3.Z3_BOOL_SORT else z3.ArithRef)(ast, ctx)


def fast_and(ctx: z3.Context, exprs: list[z3.BoolRef]) -> z3.BoolRef:
    """z3.And without per-argument Python casts (hot in assumption classification)."""
    if not exprs:
        return z3.BoolVal(True, ctx)
    arr = (z3.Ast * len(exprs))(*[e.as_ast() for e in exprs])
    return z3.BoolRef(z3.Z3_mk_and(ctx.ref(), len(exprs), arr), ctx)


def fast_or(ctx: z3.Context, exprs: list[z3.BoolRef]) -> z3.BoolRef:
    if not exprs:
        return z3.BoolVal(False, ctx)
    arr = (z3.Ast * len(exprs))(*[e.as_ast() for e in exprs])
    return z3.BoolRef(z3.Z3_mk_or(ctx.ref(), len(exprs), arr), ctx)


def _conj(members: list[str]) -> str:
    if not members:
        return "true"
    return members[0] if len(members) == 1 else "(and " + " ".join(members) + ")"


def _spans(ts: list[float]) -> list[tuple]:
    """Cells: (-inf, t1), [t1], (t1, t2), ..., [tn], (tn, inf)."""
    spans, prev = [], None
    for t in ts:
        spans.append((prev, t, True, True))
        spans.append((t, t, False, False))
        prev = t
    spans.append((prev, None, True, False))
    return spans


def _span_text(var: str, sort: str, lo, hi, lo_s, hi_s) -> str:
    ends = [x for x in (lo, hi) if x is not None]
    if sort == "Int" and not all(float(x).is_integer() for x in ends):
        var, sort = f"(to_real {var})", "Real"  # an int atom against a fractional threshold

    def lit(x):
        return num(int(x), "Int") if sort == "Int" else num(float(x), "Real")

    if lo is not None and hi is not None and lo == hi:
        return f"(= {var} {lit(lo)})"
    parts = []
    if lo is not None:
        parts.append(f"({'>' if lo_s else '>='} {var} {lit(lo)})")
    if hi is not None:
        parts.append(f"({'<' if hi_s else '<='} {var} {lit(hi)})")
    return _conj(parts)


def _complex_numeric(program: TrialProgram) -> set[str]:
    out: set[str] = set()
    for f in [d.formula for d in program.definitions] + [cr.formula for _, _, cr in program.criteria()]:
        out |= numeric_in_complex_terms(f)
    return out


def bounds_expr(var, lo, hi, lo_strict, hi_strict) -> z3.BoolRef:
    ctx = var.ctx
    parts = []
    if lo is not None and hi is not None and lo == hi:
        return var == num_val(var, lo)
    if lo is not None:
        parts.append(var > num_val(var, lo) if lo_strict else var >= num_val(var, lo))
    if hi is not None:
        parts.append(var < num_val(var, hi) if hi_strict else var <= num_val(var, hi))
    return z3.And(parts) if parts else z3.BoolVal(True, ctx)


def value_expr(var, value=None, bounds: Bounds | None = None) -> z3.BoolRef:
    """The constraint a resolved value (or interval) puts on an atom."""
    if bounds is not None:
        return bounds_expr(var, bounds.lo, bounds.hi, bounds.lo_strict, bounds.hi_strict)
    if isinstance(value, bool):
        return var if value else z3.Not(var)
    return var == num_val(var, value)


def num_val(like, x):
    """A numeral of the atom's sort (an int atom compared with a fraction is compared in the reals)."""
    if z3.is_int(like) and float(x).is_integer():
        return z3.IntVal(int(x), like.ctx)
    return z3.RealVal(x, like.ctx)


def _components(names: list[str], groups: list[frozenset[str]]) -> dict[str, frozenset[str]]:
    parent = {n: n for n in names}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for g in groups:
        g = list(g)
        for other in g[1:]:
            parent[find(other)] = find(g[0])
    comp: dict[str, set[str]] = {}
    for n in list(parent):
        comp.setdefault(find(n), set()).add(n)
    return {n: frozenset(comp[find(n)]) for n in parent}


def _cone(component, names) -> frozenset[str]:
    out: set[str] = set()
    for n in names:
        out |= component.get(n, frozenset([n]))
    return frozenset(out)
