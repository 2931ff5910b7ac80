"""ρ: the assumptions an eligible decision rests on, classified as in appendix A.5.

For each unresolved atom u (facts F, program φ including definitions):
- forced: every completion that admits the patient agrees on u. A bool gets its value; a numeric
  atom gets the region the admitting completions allow (stated as the trial's requirement).
- inert: among patients consistent with the definitions, changing u never changes whether some
  cohort admits the patient (no completion σ and values a, b with defs(σ,a), defs(σ,b) and
  req(σ,a) != req(σ,b)). Atoms only in the cones of criteria the facts already settle are inert
  without a solver call.
- alternative: u matters, but several completions serve; no value is reported, because which one
  a solver picks is an accident of search order (the paper reports the search's choice instead).
Each class is a logical property of (φ, F), so ρ does not depend on solver search order, clause
order or atom names.
"""

from __future__ import annotations

import z3

from .compile import fast_and, fast_or
from .decision import Assumption, CriterionLabel
from .formula import Unknown, evaluate
from .session import Session


def classify(
    sess: Session, witness: z3.ModelRef, labels: list[CriterionLabel]
) -> tuple[list[Assumption], dict]:
    """Returns (assumptions, forced). forced maps atom -> (value, admissible cells or None, flips):
    flips lists what confirming would make the patient ineligible while staying consistent with the
    definitions (the other bool value, or the inadmissible cells) - δ_I's single-atom candidates."""
    cp = sess.cp
    lits = sess.lits()
    settled = {(lb.cohort, lb.criterion) for lb in labels if lb.label == "satisfied"}
    decided = {(lb.cohort, lb.criterion) for lb in labels if lb.label != "deferred"}
    open_cones: set[str] = set()
    mentions: dict[str, list[str]] = {}
    for cc in cp.criteria:
        if (cc.cohort, cc.criterion.id) not in settled:
            open_cones |= cc.cone
        for a in cc.cone:
            mentions.setdefault(a, []).append(cc.key)
    in_defs = set().union(*(names for _, _, names in cp.definitions)) if cp.definitions else set()
    used = [u for u in sess.unresolved() if u in mentions or u in in_defs]
    targets = []
    for u in used:
        targets += [cp.vars[u]] if cp.atoms[u].domain == "bool" else [c.guard for c in cp.cells[u]]
    # `consequences` is sound but may miss entailments; what it leaves open is settled by kept
    # models or an explicit check.
    under_phi = sess.consequences(lits + [cp.phi_guard], targets)
    out: list[Assumption] = []
    forced: dict[str, tuple] = {}
    for u in used:
        var, crit = cp.vars[u], mentions.get(u, [])
        if cp.atoms[u].domain == "bool":
            got = under_phi.get(var.get_id())
            m = got[0] if got else _forced_bool(sess, var, lits)
            if m is not None:
                if not _possible(sess, var == z3.BoolVal(not m, sess.ctx), lits):
                    continue  # settled by the facts and definitions: derived, not assumed
                forced[u] = (m, None, [not m])
                out.append(
                    Assumption(
                        atom=u, cls="forced", value=m, requirement=sess.requirement(u, m), criteria=crit
                    )
                )
                continue
        else:
            cells = cp.cells[u]
            admissible = [c for c in cells if _cell_admissible(sess, c, under_phi, lits)]
            if len(admissible) < len(cells):
                flips = [c for c in cells if c not in admissible and _possible(sess, c.guard, lits)]
                if not flips:
                    continue  # settled by the facts and definitions: derived, not assumed
                region = sess.region(u, admissible)
                value = (
                    admissible[0].lo
                    if len(admissible) == 1 and admissible[0].lo == admissible[0].hi
                    else None
                )
                forced[u] = (value, admissible, flips)
                out.append(
                    Assumption(
                        atom=u,
                        cls="forced",
                        value=value,
                        requirement=sess.requirement(u, value, region),
                        criteria=crit,
                    )
                )
                continue
        # Admission reads u only through the criteria that mention it; if the facts settle all of
        # those, no consistent patient's admission can change with u.
        direct = {(cc.cohort, cc.criterion.id) for cc in cp.mentions(u)[1]}
        if u not in open_cones or direct <= decided:
            cls = "inert"
        else:
            cls = "alternative" if _flip_changes_admission(sess, u) or _depends(sess, var, lits) else "inert"
        out.append(Assumption(atom=u, cls=cls, criteria=crit))
    return out, forced


def _forced_bool(sess: Session, var, lits):
    """The value every admitting completion gives var, or None."""
    t, f = sess.seen(var, admitting=True)
    if t and f:
        return None
    m = t  # the value the kept admitting models agree on
    if sess.check(sess.cp.phi_guard, *lits, var != z3.BoolVal(m, sess.ctx)):
        sess.model(admitting=True)
        return None
    return m


def _cell_admissible(sess: Session, cell, under_phi: dict, lits) -> bool:
    got = under_phi.get(cell.guard.get_id())
    if got is not None:
        return got[0]
    if sess.seen(cell.guard, admitting=True)[0]:
        return True
    if sess.check(sess.cp.phi_guard, *lits, cell.guard):
        sess.model(admitting=True)
        return True
    return False


def _possible(sess: Session, lit, lits) -> bool:
    """Is lit consistent with the facts and definitions (a counterfactual patient could have it)?"""
    if sess.seen(lit)[0]:
        return True
    return sess.check(sess.guard(lit, "possible") if not _is_literal(lit) else lit, *lits)


def _is_literal(e) -> bool:
    return z3.is_const(e) or (z3.is_not(e) and z3.is_const(e.arg(0)))


def _flip_changes_admission(sess: Session, u: str) -> bool:
    """A kept model whose admission changes when the bool atom u alone is flipped, with the
    definitions still true, proves dependence without a solver call (only formulas mentioning u
    are re-evaluated; other criteria keep the model's values)."""
    cp = sess.cp
    if cp.atoms[u].domain != "bool":
        return False
    defs, crits = cp.mentions(u)
    touched = {cc.index for cc in crits}
    for m in sess.models:
        value = sess.value_in(m, u)
        env = sess.lazy_env(m, {u: not value})
        try:
            if not all(evaluate(f, env) for f in defs):
                continue
            before = after = False
            for cid in cp.cohort_ids:
                members = [cc for cc in cp.criteria if cc.cohort == cid]
                vals = {cc.index: z3.is_true(m.eval(cc.indicator, model_completion=True)) for cc in members}
                before |= all(vals.values())
                after |= all(
                    bool(evaluate(cc.criterion.formula, env)) == (cc.side == "inclusion")
                    if cc.index in touched
                    else vals[cc.index]
                    for cc in members
                )
            if before != after:
                return True
        except (Unknown, ZeroDivisionError, TypeError):
            continue
    return False


def _depends(sess: Session, var: z3.ExprRef, lits) -> bool:
    """Is there a consistent patient whose admission changes with u alone? Only formulas that
    mention u change under substitution; every other criterion enters through its indicator and
    every other definition is already asserted, which keeps the query small."""
    cp = sess.cp
    if z3.is_bool(var):
        a, b = z3.BoolVal(True, sess.ctx), z3.BoolVal(False, sess.ctx)
    else:
        a, b = z3.FreshConst(var.sort(), "!a"), z3.FreshConst(var.sort(), "!b")
    name = var.decl().name()
    defs = [e for _, e, names in cp.definitions if name in names]
    touched = {cc.index for cc in cp.mentions(name)[1]}

    def admitted(x):
        cohorts = []
        for cid in cp.cohort_ids:
            parts = [
                z3.substitute(cc.requirement, (var, x)) if cc.index in touched else cc.indicator
                for cc in cp.criteria
                if cc.cohort == cid
            ]
            cohorts.append(fast_and(sess.ctx, parts))
        return fast_or(sess.ctx, cohorts)

    consistent = [z3.substitute(e, (var, x)) for e in defs for x in (a, b)]
    differs = fast_and(sess.ctx, consistent + [z3.Xor(admitted(a), admitted(b))])
    return sess.check(sess.guard(differs, "depends"), *lits)
