"""One decision in progress: the patient's facts as assumption literals on a compiled program.

Everything the artifacts need goes through ``Session.check`` (counted, time-limited) so that a
solver limit surfaces as ``SolverLimit`` instead of a guess. The limit is one budget for the whole
session (a decision), not one per call: a program of many hard criteria stops after it, not after
as many limits as it has calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3

from .compile import Cell, CompiledProgram
from .decision import Fact, Interval, Requirement
from .formula import fmt_number as _fmt
from .patient import Resolution, in_interval


class SolverLimit(Exception):
    """A solver call returned unknown (timeout or resource limit)."""


@dataclass(frozen=True)
class FactLit:
    atom: str
    resolution: Resolution
    lit: z3.BoolRef  # assumption literal that switches the fact on
    expr: z3.BoolRef  # the constraint itself

    def cite(self) -> Fact:
        r = self.resolution
        return Fact(
            atom=r.atom,
            value=r.value,
            bounds=r.bounds,
            status=r.status,
            evidence=r.evidence,
            rule=r.imputation.rule if r.imputation else None,
        )


class Session:
    def __init__(self, cp: CompiledProgram, resolutions: list[Resolution], timeout_ms: int):
        self.cp, self.ctx, self.s = cp, cp.ctx, cp.solver
        self.timeout_ms = timeout_ms
        self.deadline = time.monotonic() + timeout_ms / 1000
        self.checks = 0
        table = cp.atoms
        self.key = {n: (a.definition, a.kind, a.domain, a.unit or "", n) for n, a in table.items()}
        self.facts: list[FactLit] = sorted(
            (self._fact(r) for r in resolutions if r.resolved), key=lambda f: self.key[f.atom]
        )
        self.models: list[z3.ModelRef] = []  # models of facts + definitions
        self.admitting: list[z3.ModelRef] = []  # models of facts + definitions + some cohort

    # -- facts -------------------------------------------------------------------------------------
    def _fact(self, r: Resolution) -> FactLit:
        expr = self.cp.fact_expr(r.atom, r.value, r.bounds)
        if isinstance(r.value, bool):
            return FactLit(r.atom, r, expr, expr)  # a bool fact is its own assumption literal
        return FactLit(r.atom, r, self.guard(expr, f"fact:{r.atom}"), expr)

    def guard(self, expr: z3.BoolRef, name: str = "g") -> z3.BoolRef:
        """A fresh literal g with g => expr, valid until the session's pop."""
        g = z3.FreshBool(f"!{name}", self.ctx)
        self.s.add(z3.Implies(g, expr))
        return g

    def set_facts(self, facts: list[FactLit]) -> None:
        self.facts = sorted(facts, key=lambda f: self.key[f.atom])

    @property
    def fact_atoms(self) -> set[str]:
        return {f.atom for f in self.facts}

    def unresolved(self) -> list[str]:
        have = self.fact_atoms
        return sorted((n for n in self.cp.atoms if n not in have), key=self.key.__getitem__)

    def fact_env(self, facts=None) -> dict:
        """atom -> value or Bounds, for three-valued evaluation."""
        return {
            f.atom: (f.resolution.value if f.resolution.value is not None else f.resolution.bounds)
            for f in (self.facts if facts is None else facts)
        }

    def lits(self, facts=None) -> list[z3.BoolRef]:
        return [f.lit for f in (self.facts if facts is None else facts)]

    # -- solving -----------------------------------------------------------------------------------
    def call_limit_ms(self) -> int:
        """The time a solver call may take now: what is left of the session's budget."""
        left = int((self.deadline - time.monotonic()) * 1000)
        if left <= 0:
            raise SolverLimit(f"solver time limit spent ({self.timeout_ms} ms per decision)")
        return min(left, self.timeout_ms)

    def _limited(self, call):
        """Run a call on the session's solver within what is left of the budget."""
        limit = self.call_limit_ms()
        if limit >= self.timeout_ms:
            return call()
        self.s.set("timeout", limit)  # the compiled solver is shared: put its limit back afterwards
        try:
            return call()
        finally:
            self.s.set("timeout", self.timeout_ms)

    def _unknown(self) -> SolverLimit:
        reason = self.s.reason_unknown()
        return SolverLimit(f"solver returned unknown ({reason}; limit {self.timeout_ms} ms per decision)")

    def check(self, *assumptions: z3.BoolRef) -> bool:
        """True = sat, False = unsat; raises SolverLimit on unknown."""
        self.checks += 1
        # The low-level call: z3's Solver.check re-casts every assumption in Python, which costs
        # more than the solving itself on these small programs.
        arr = (z3.Ast * len(assumptions))(*[a.as_ast() for a in assumptions])
        n = len(assumptions)
        r = self._limited(lambda: z3.Z3_solver_check_assumptions(self.ctx.ref(), self.s.solver, n, arr))
        if r == z3.Z3_L_TRUE:
            return True
        if r == z3.Z3_L_FALSE:
            return False
        raise self._unknown()

    def consequences(
        self, assumptions: list[z3.BoolRef], targets: list[z3.BoolRef]
    ) -> dict[int, tuple[bool, list[FactLit] | None]]:
        """Which targets the assumptions entail, in one solver call: target id -> (value, facts
        used). The facts used are reported only when none or a single fact settles the target
        (None otherwise): reading long antecedents back through the Python API costs more than
        it saves. Sound but not complete. Raises SolverLimit if the solver cannot say."""
        self.checks += 1
        r, cons = self._limited(lambda: self.s.consequences(assumptions, targets))
        if r == z3.unknown:
            raise self._unknown()
        if r == z3.unsat:
            raise ValueError("consequences asked of inconsistent assumptions")
        by_lit = {f.lit.get_id(): f for f in self.facts}
        out: dict[int, tuple[bool, list[FactLit] | None]] = {}
        for imp in cons:
            ante, lit = imp.arg(0), imp.arg(1)
            negative = z3.is_not(lit)
            target = lit.arg(0) if negative else lit
            if z3.is_true(ante):
                used: list[FactLit] | None = []
            elif ante.get_id() in by_lit:
                used = [by_lit[ante.get_id()]]
            else:
                used = None
            out[target.get_id()] = (not negative, used)
        return out

    def lazy_env(self, m: z3.ModelRef, overrides: dict) -> dict:
        """Atom values of a model, read on demand (most evaluations touch a few atoms)."""
        return _ModelEnv(self, m, overrides)

    def env(self, m: z3.ModelRef) -> dict:
        """Atom values of a model as Python values (model completion for atoms it leaves out)."""
        return {a: self.value_in(m, a) for a in self.cp.atoms}

    def model(self, admitting: bool = False) -> z3.ModelRef:
        """The last check's model, kept (up to a few) to settle later questions without a call.
        Only call this after a sat check whose assumptions included all facts."""
        m = self.s.model()
        if len(self.models) < 8:
            self.models.append(m)
        if admitting and len(self.admitting) < 8:
            self.admitting.append(m)
        return m

    def seen(self, expr: z3.BoolRef, admitting: bool = False) -> tuple[bool, bool]:
        """Whether some kept model makes ``expr`` true / false."""
        t = f = False
        for m in self.admitting if admitting else self.models:
            v = bool_in(m, expr)
            t |= v == z3.Z3_L_TRUE
            f |= v == z3.Z3_L_FALSE
            if t and f:
                break
        return t, f

    def value_in(self, m: z3.ModelRef, atom: str):
        return py_value(m.eval(self.cp.vars[atom], model_completion=True))

    # -- numeric regions ---------------------------------------------------------------------------
    def cell_of(self, atom: str, x: float) -> Cell:
        return next(c for c in self.cp.cells[atom] if c.contains(x))

    def region(self, atom: str, cells: list[Cell]) -> list[Interval]:
        """Merge chosen cells (in order) into maximal intervals."""
        chosen = set(id(c) for c in cells)
        out: list[Interval] = []
        run: list[Cell] = []
        for c in self.cp.cells[atom] + [None]:  # type: ignore[list-item]
            if c is not None and id(c) in chosen:
                run.append(c)
                continue
            if run:
                lo, hi = run[0].lo, run[-1].hi
                out.append(
                    Interval(
                        lo=lo,
                        hi=hi,
                        lo_strict=lo is not None and run[0].lo_strict,
                        hi_strict=hi is not None and run[-1].hi_strict,
                    )
                )
                run = []
        return out

    def requirement(self, atom: str, value=None, intervals: list[Interval] | None = None) -> Requirement:
        a = self.cp.atoms[atom]
        if a.domain == "bool":
            return Requirement(text=f"{atom} = {'true' if value else 'false'}", value=value)
        unit = f" {a.unit}" if a.unit else ""
        parts = [interval_text(atom, iv, a.domain == "int") + unit for iv in intervals or []]
        exact = atom not in self.cp.complex_numeric
        text = " or ".join(parts) if parts else f"{atom} = {value}{unit}"
        if not exact:
            text += " (region of the simple comparisons only; the atom also occurs in computed terms)"
        return Requirement(text=text, intervals=intervals or [], exact=exact)

    def target_in(self, atom: str, intervals: list[Interval], current: float | None):
        """A representative value meeting the requirement: the nearest to the current value."""
        integer = self.cp.atoms[atom].domain == "int"
        best = None
        for iv in intervals:
            v = _pick(iv, current, integer)
            if v is None:
                continue
            d = abs(v - current) if current is not None else 0
            if best is None or d < best[0]:
                best = (d, v)
        return None if best is None else best[1]


class _ModelEnv(dict):
    # A plain class, not one made per call: a class is a reference cycle, and a cycle holding z3
    # objects is freed by the garbage collector at an arbitrary moment (see engine._shared_context).
    def __init__(self, sess: Session, m: z3.ModelRef, overrides: dict):
        super().__init__(overrides)
        self.sess, self.m = sess, m

    def __missing__(self, atom):
        v = self[atom] = self.sess.value_in(self.m, atom)
        return v


def bool_in(m: z3.ModelRef, expr: z3.BoolRef) -> int:
    """A Boolean term's value in a model (completed): Z3_L_TRUE / Z3_L_FALSE / Z3_L_UNDEF. Low-level,
    because ModelRef.eval wraps and type-checks every result in Python (hot on the warm path)."""
    ctx, out = m.ctx.ref(), (z3.Ast * 1)()
    if not z3.Z3_model_eval(ctx, m.model, expr.as_ast(), True, out):
        return z3.Z3_L_UNDEF
    return z3.Z3_get_bool_value(ctx, out[0])


def true_in(m: z3.ModelRef, expr: z3.BoolRef) -> bool:
    return bool_in(m, expr) == z3.Z3_L_TRUE


def py_value(v: z3.ExprRef):
    """A Z3 value as bool / int / float (None if it is not a value)."""
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_rational_value(v):
        return float(v.numerator_as_long()) / float(v.denominator_as_long())
    if z3.is_algebraic_value(v):
        return float(v.approx(12).as_decimal(12).rstrip("?"))
    return None


def interval_text(name: str, iv: Interval, integer: bool = False) -> str:
    lo, hi = iv.lo, iv.hi
    fmt_number = (lambda x: str(int(x)) if float(x).is_integer() else str(x)) if integer else _fmt
    if lo is not None and hi is not None and lo == hi:
        return f"{name} = {fmt_number(lo)}"
    if lo is None and hi is None:
        return f"{name} any value"
    if lo is None:
        return f"{name} {'<' if iv.hi_strict else '<='} {fmt_number(hi)}"
    if hi is None:
        return f"{name} {'>' if iv.lo_strict else '>='} {fmt_number(lo)}"
    return (
        f"{fmt_number(lo)} {'<' if iv.lo_strict else '<='} {name} "
        f"{'<' if iv.hi_strict else '<='} {fmt_number(hi)}"
    )


def _pick(iv: Interval, current: float | None, integer: bool):
    """Nearest point of an interval to ``current`` (a 'nice' interior point for strict ends)."""
    import math

    lo, hi = iv.lo, iv.hi
    width = (hi - lo) if lo is not None and hi is not None else None
    step = 1.0 if width is None else min(1.0, width / 2)
    cands = []
    if lo is not None and hi is not None and lo == hi:
        cands = [lo]
    else:
        if lo is not None:
            cands.append(lo + step if iv.lo_strict else lo)
        if hi is not None:
            cands.append(hi - step if iv.hi_strict else hi)
        if current is not None and in_interval(iv, current):
            cands.append(current)
        if not cands:
            cands = [0.0]
    if integer:
        ints = []
        for c in cands:
            ints += [math.floor(c), math.ceil(c)]
        cands = [float(c) for c in ints if in_interval(iv, c)]
        if not cands and lo is not None and hi is not None:
            k = math.floor(lo) + 1
            cands = [float(k)] if in_interval(iv, k) else []
    cands = [c for c in cands if in_interval(iv, c)]
    if not cands:
        return None
    best = min(cands, key=lambda c: abs(c - current)) if current is not None else cands[0]
    return int(best) if integer else best
