"""δ: pivotal conditions, minimum-cardinality and self-faithful in both directions.

to_eligible (δ_E, ineligible patients): the fewest resolved facts whose change admits the patient,
with unresolved atoms free and definitions hard (a counterfactual patient is a consistent one).

to_ineligible (δ_I, eligible patients): the fewest conditions - resolved facts to change or
unresolved atoms to confirm - after which *no* completion of the remaining unresolved atoms admits
the patient. Unlike step 5 as printed (which fixes ρ), unresolved atoms stay free, so a reported
pivot really flips the decision: for "A or B" with A observed and B open, δ_I is {A false, B
confirmed false}, not {A false}. This is a 2-level problem (∃ changes ∀ completions); single
changes are scanned directly, larger sets come from counterexample-guided search (CEGAR) over a
MaxSMT abstraction.

Several minimum sets can exist; all of them are enumerated up to a cap and the primary one is the
first in content order (atom definition, kind, ...), so δ does not depend on solver search order
or atom names. Numeric pivots are stated as the region the trial's comparisons allow (union of
the program's threshold cells), with a representative target value inside it.
"""

from __future__ import annotations

from collections.abc import Callable

import z3

from .compile import fast_or, num_val
from .decision import Pivotal, PivotalCondition, PivotalSet
from .formula import Unknown, evaluate
from .session import FactLit, Session, SolverLimit, py_value, true_in

CEGAR_ITERATIONS = 400


def _conditions(sess: Session, change: dict[str, tuple]) -> list[PivotalCondition]:
    """change: atom -> (target value, intervals or None)."""
    facts = {f.atom: f for f in sess.facts}
    out = []
    for atom in sorted(change, key=sess.key.__getitem__):
        target, intervals = change[atom]
        f = facts.get(atom)
        r = f.resolution if f else None
        req = (
            sess.requirement(atom, target, intervals)
            if intervals is not None
            else sess.requirement(atom, target)
        )
        out.append(
            PivotalCondition(
                atom=atom,
                action="change" if f else "confirm",
                current=r.value if r else None,
                current_bounds=r.bounds if r else None,
                target=target,
                requirement=req,
            )
        )
    return out


def _numeric_region(
    sess: Session, atom: str, base: list[z3.BoolRef], flips_when_sat: bool, current, single: bool = False
):
    """Cells of ``atom`` that produce the wanted outcome with ``base`` assumptions; returns
    (target, intervals) or None. flips_when_sat: True for δ_E (want sat), False for δ_I (want
    unsat and still consistent with the definitions)."""
    cp = sess.cp
    chosen = []
    phi_base = [cp.phi_guard] + base
    for c in cp.cells[atom]:
        if current is not None and not isinstance(current, bool) and c.contains(current):
            continue
        if flips_when_sat:
            if sess.check(*phi_base, c.guard):
                chosen.append(c)
            continue
        # only a single change on top of the actual facts may reuse the kept models
        rep = (
            c.representative(cp.atoms[atom].domain == "int")
            if single and atom not in cp.complex_numeric
            else None
        )
        if rep is not None and still_admits(sess, atom, rep):
            continue  # a model with the atom in this cell still admits the patient
        if not sess.check(*phi_base, c.guard) and sess.check(*base, c.guard):
            chosen.append(c)
    if not chosen:
        return None
    intervals = sess.region(atom, chosen)
    target = sess.target_in(atom, intervals, current if isinstance(current, (int, float)) else None)
    return None if target is None else (target, intervals)


def _fix(sess: Session, atom: str, value) -> z3.BoolRef:
    expr = sess.cp.fact_expr(atom, value)
    return expr if isinstance(value, bool) else sess.guard(expr, "fix")


def _first_raw(sess: Session, sets: list[dict], alternatives: int) -> list[dict]:
    """The first sets in content order, before widening numeric targets to regions (widening
    costs solver calls, so only the sets that are reported get it). A numeric value is keyed by
    its cell: every value in a cell behaves alike."""

    def key(values: dict):
        out = []
        for a, v in values.items():
            if isinstance(v, bool) or a in sess.cp.complex_numeric:
                out.append((sess.key[a], repr(v)))
            else:
                out.append((sess.key[a], repr(sess.cp.cells[a].index(sess.cell_of(a, v)))))
        return tuple(sorted(out))

    unique = {}
    for values in sets:
        unique.setdefault(key(values), values)
    return [unique[k] for k in sorted(unique)][: 1 + alternatives]


def _assemble(
    sess: Session, direction: str, sets: list[dict], complete: bool, alternatives: int, note=None
) -> Pivotal:
    """Order the minimum sets by content (atom keys, then targets) and keep distinct ones."""

    def key(change: dict):
        return tuple(sorted((sess.key[a], repr(t), repr(ivs)) for a, (t, ivs) in change.items()))

    unique = {}
    for change in sets:
        unique.setdefault(key(change), change)
    ordered = [unique[k] for k in sorted(unique)]
    if not ordered:
        return Pivotal(
            direction=direction,
            complete=complete,
            note=note or "no change of the modelled conditions flips the decision",
        )
    primary = _conditions(sess, ordered[0])
    alts = [
        PivotalSet(direction=direction, conditions=_conditions(sess, s))
        for s in ordered[1 : 1 + alternatives]
    ]
    return Pivotal(direction=direction, conditions=primary, alternatives=alts, complete=complete, note=note)


# ---- δ_E: ineligible -> eligible ---------------------------------------------------------------
def to_eligible(sess: Session, labels, alternatives: int, cap: int) -> Pivotal:
    cp = sess.cp
    # A cohort keeps a violated criterion whose cone the changed fact does not reach: such a fact
    # cannot admit the patient on its own, so it needs no solver call.
    blocking = {
        cid: [cc.cone for cc, lb in zip(cp.criteria, labels) if cc.cohort == cid and lb.label == "violated"]
        for cid in cp.cohort_ids
    }
    singles: list[dict] = []
    for f in sess.facts:  # content order; stop once the primary and the alternatives are found
        if all(any(f.atom not in cone for cone in blocking[cid]) for cid in cp.cohort_ids):
            continue
        rest = [x.lit for x in sess.facts if x is not f]
        if not sess.check(cp.phi_guard, *rest):
            continue
        if isinstance(f.resolution.value, bool):
            singles.append({f.atom: (not f.resolution.value, None)})
        else:
            got = _numeric_region(sess, f.atom, rest, True, f.resolution.value)
            if got:
                singles.append({f.atom: got})
        if len(singles) > alternatives:
            break
    return _singles_or_sets(sess, "to_eligible", singles, lambda: _maxsmt_sets(sess, cap), alternatives)


def _singles_or_sets(
    sess: Session, direction: str, singles: list, search: Callable[[], tuple[list, bool]], alternatives: int
) -> Pivotal:
    """δ from the single-atom changes when there are any, else from the first sets `search` finds
    (sets, complete), widened."""
    if singles:
        return _assemble(sess, direction, singles, True, alternatives)
    sets, complete = search()
    chosen = _first_raw(sess, sets, alternatives)
    return _assemble(
        sess,
        direction,
        [_widened(sess, v, direction == "to_eligible") for v in chosen],
        complete,
        alternatives,
        _cap_note(sets, complete),
    )


def _cap_note(sets: list, complete: bool) -> str | None:
    if complete or not sets:
        return None
    return (
        f"enumeration stopped after {len(sets)} minimum sets; the primary set is the first in content "
        "order among those found"
    )


def _maxsmt_sets(sess: Session, cap: int) -> tuple[list[dict], bool]:
    """Minimum sets of facts to change (raw model values), enumerated: one MaxSMT call finds the
    minimum size k, then a plain solver with "at most k facts relaxed" and blocking clauses lists
    the other sets of that size (one SAT call each instead of one MaxSMT call each)."""
    cp = sess.cp
    opt = z3.Optimize(ctx=sess.ctx)
    opt.set("timeout", sess.call_limit_ms())
    opt.add(cp.aux, cp.phi_req)
    for f in sess.facts:
        opt.add_soft(f.expr, 1)
    sess.checks += 1
    r = opt.check()
    if r != z3.sat:
        raise SolverLimit(f"MaxSMT did not finish ({opt.reason_unknown()})")
    m = opt.model()
    first = [f for f in sess.facts if not true_in(m, f.expr)]
    sets = [{f.atom: sess.value_in(m, f.atom) for f in first}]
    k = len(first)
    s2 = z3.Solver(ctx=sess.ctx)
    s2.set("timeout", sess.call_limit_ms())
    s2.add(cp.aux, cp.phi_req)
    relax = {f.atom: z3.FreshBool("!relax", sess.ctx) for f in sess.facts}
    ctx = sess.ctx
    for f in sess.facts:
        s2.add(fast_or(ctx, [relax[f.atom], f.expr]))
    s2.add(z3.AtMost(*relax.values(), k))
    s2.add(fast_or(ctx, [f.expr for f in first]))
    while len(sets) < cap:
        sess.checks += 1
        r = s2.check()
        if r == z3.unsat:
            return sets, True
        if r != z3.sat:
            return sets, False
        m = s2.model()
        dropped = [f for f in sess.facts if not true_in(m, f.expr)]
        sets.append({f.atom: sess.value_in(m, f.atom) for f in dropped})
        s2.add(fast_or(ctx, [f.expr for f in dropped]))
    return sets, False


def _widened(sess: Session, values: dict, want_eligible: bool) -> dict:
    """Target per changed atom; a numeric target is widened to its region (the cells that still
    give the wanted outcome with the other changes at their targets)."""
    kept = [f.lit for f in sess.facts if f.atom not in values]
    out = {}
    for a, value in values.items():
        if isinstance(value, bool):
            out[a] = (value, None)
            continue
        others = [_fix(sess, b, values[b]) for b in values if b != a]
        current = next((f.resolution.value for f in sess.facts if f.atom == a), None)
        got = _numeric_region(sess, a, kept + others, want_eligible, current)
        out[a] = got if got else (value, None)
    return out


# ---- δ_I: eligible -> ineligible ---------------------------------------------------------------
def to_ineligible(
    sess: Session, forced: dict, witness: z3.ModelRef, sides, alternatives: int, cap: int
) -> Pivotal:
    """Single changes are tried in content order and the scan stops once the primary pivot and
    `alternatives` more are found: the result is the same as a full scan, at a fraction of the
    solver calls."""
    admitting = [s.cohort for s in sides if s.admits]
    facts = {f.atom: f for f in sess.facts}
    singles: list[dict] = []
    for atom in sorted(set(forced) | set(facts), key=sess.key.__getitem__):
        got = (
            _forced_single(sess, atom, forced[atom])
            if atom in forced
            else _fact_single(sess, facts[atom], admitting)
        )
        if got:
            singles.append({atom: got})
            if len(singles) > alternatives:
                break
    return _singles_or_sets(
        sess, "to_ineligible", singles, lambda: _cegar_sets(sess, witness, cap), alternatives
    )


def _forced_single(sess: Session, u: str, info: tuple):
    """Confirming the value every admitting completion excludes (consistent with the definitions)."""
    value, admissible, flips = info
    if not flips:
        return None
    if admissible is None:
        return (flips[0], None)
    intervals = sess.region(u, flips)
    target = sess.target_in(u, intervals, None)
    return None if target is None else (target, intervals)


def _fact_single(sess: Session, f: FactLit, admitting: list[str]):
    if _cannot_break(sess, f, admitting):
        return None
    rest = [x.lit for x in sess.facts if x is not f]
    if isinstance(f.resolution.value, bool):
        flipped = z3.Not(f.lit)
        if not sess.check(sess.cp.phi_guard, *rest, flipped) and sess.check(*rest, flipped):
            return (not f.resolution.value, None)
        return None
    return _numeric_region(sess, f.atom, rest, False, f.resolution.value, single=True)


def _cannot_break(sess: Session, f: FactLit, admitting: list[str], env=None) -> bool:
    """Sound shortcuts for 'changing f alone leaves the patient eligible'."""
    cp = sess.cp
    touched = {cid: [cc for cc in cp.criteria if cc.cohort == cid and f.atom in cc.cone] for cid in admitting}
    if any(not ccs for ccs in touched.values()):
        return True  # an admitting cohort does not depend on f at all
    return isinstance(f.resolution.value, bool) and still_admits(sess, f.atom, not f.resolution.value)


def still_admits(sess: Session, atom: str, value) -> bool:
    """Does some kept admitting model stay a model - definitions true, some cohort it admits still
    admitting - when ``atom`` alone takes ``value``? Then that change cannot exclude the patient.
    Only the formulas that mention the atom need re-evaluating."""
    cp = sess.cp
    defs, crits = cp.mentions(atom)
    for m in sess.admitting:
        env = sess.lazy_env(m, {atom: value})
        try:
            if not all(evaluate(f, env) for f in defs):
                continue
            for cid in cp.cohort_ids:
                if not z3.is_true(m.eval(cp.cohort_guard[cid], model_completion=True)):
                    continue
                if all(
                    bool(evaluate(cc.criterion.formula, env)) == (cc.side == "inclusion")
                    for cc in crits
                    if cc.cohort == cid
                ):
                    return True
        except (Unknown, ZeroDivisionError, TypeError):
            continue
    return False


def _cegar_sets(sess: Session, witness: z3.ModelRef, cap: int) -> tuple[list[dict], bool]:
    cp, ctx = sess.cp, sess.ctx
    exact = {f.atom: f for f in sess.facts if f.resolution.value is not None}
    bounded = {f.atom: f for f in sess.facts if f.resolution.bounds is not None}
    used = (
        set().union(*(cc.cone for cc in cp.criteria), *(n for _, _, n in cp.definitions))
        if cp.criteria
        else set()
    )
    atoms = sorted(used, key=sess.key.__getitem__)
    ch = {a: z3.Bool(f"!ch:{a}", ctx) for a in atoms}
    nv = {a: z3.FreshConst(cp.vars[a].sort(), "!nv") for a in atoms}
    opt = z3.Optimize(ctx=ctx)
    opt.set("timeout", sess.call_limit_ms())
    for a in atoms:  # new numeric values range over cell representatives: exact for simple atoms, finite
        if cp.atoms[a].domain != "bool":
            reps = [
                r for c in cp.cells[a] if (r := c.representative(cp.atoms[a].domain == "int")) is not None
            ]
            opt.add(z3.Or([nv[a] == num_val(nv[a], r) for r in reps]))
        if a in exact and isinstance(exact[a].resolution.value, bool):
            opt.add(z3.Implies(ch[a], nv[a] == z3.BoolVal(not exact[a].resolution.value, ctx)))

    def world(values: dict) -> list[tuple]:
        pairs = []
        for a in atoms:
            if a in exact:
                base = _const(cp.vars[a], exact[a].resolution.value)
            else:
                base = values[a]
            pairs.append((cp.vars[a], z3.If(ch[a], nv[a], base)))
        return pairs

    # the changed patient must stay consistent with the definitions (exists a completion)
    z = {a: z3.FreshConst(cp.vars[a].sort(), "!z") for a in atoms if a not in exact}
    opt.add(z3.substitute(cp.aux, *world(z)))
    for a, f in bounded.items():
        if a in z:
            opt.add(z3.Implies(z3.Not(ch[a]), z3.substitute(f.expr, (cp.vars[a], z[a]))))
    phi_full = z3.And(cp.aux, cp.phi_req)

    def add_cex(m: z3.ModelRef) -> None:
        vals = {a: m.eval(cp.vars[a], model_completion=True) for a in atoms if a not in exact}
        opt.add(z3.Not(z3.substitute(phi_full, *world(vals))))

    cost = z3.Sum([z3.If(ch[a], z3.IntVal(1, ctx), z3.IntVal(0, ctx)) for a in atoms])
    opt.minimize(cost)
    add_cex(witness)
    sets: list[dict] = []
    best = None
    for _ in range(CEGAR_ITERATIONS):
        sess.checks += 1
        r = opt.check()
        if r == z3.unknown:
            if not sets:
                raise SolverLimit(f"pivotal search did not finish ({opt.reason_unknown()})")
            return sets, False
        if r == z3.unsat:
            return sets, True
        m = opt.model()
        chosen = [a for a in atoms if z3.is_true(m.eval(ch[a], model_completion=True))]
        if best is not None and len(chosen) > best:
            return sets, True
        values = {a: py_value(m.eval(nv[a], model_completion=True)) for a in chosen}
        kept = [f.lit for f in sess.facts if f.atom not in chosen]
        fixes = [_fix(sess, a, values[a]) for a in chosen]
        if sess.check(cp.phi_guard, *kept, *fixes):
            add_cex(sess.s.model())
            continue
        best = len(chosen)
        sets.append({a: values[a] for a in chosen})
        if len(sets) >= cap:
            return sets, False
        # block this choice of atoms *and values*: the same atoms with other values is another pivot
        opt.add(z3.Or([z3.Not(ch[a]) for a in chosen] + [nv[a] != _const(nv[a], values[a]) for a in chosen]))
    return sets, False


def _const(var, value):
    if isinstance(value, bool):
        return z3.BoolVal(value, var.ctx)
    return num_val(var, value)
