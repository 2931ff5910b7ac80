"""γ: the decision trace a reviewer follows, and the per-cohort side statuses."""

from __future__ import annotations

import itertools

import z3

from .decision import Assumption, CriterionLabel, SideStatus, Trace, TraceStep
from .labels import minimal_facts
from .session import Session


def side_statuses(sess: Session) -> list[SideStatus]:
    """Per cohort: does it admit the patient, and is each side satisfiable on its own (the
    reference format's per-side `sat_like`)."""
    cp = sess.cp
    lits = sess.lits()

    def sat(guard) -> bool:
        # kept models come from the program's solver, so they give its indicators their meaning
        if sess.seen(guard)[0]:
            return True
        if sess.check(guard, *lits):
            sess.model()
            return True
        return False

    return [
        SideStatus(
            cohort=cid,
            admits=sat(cp.cohort_guard[cid]),
            inclusion_satisfiable=sat(cp.side_guard[(cid, "inclusion")]),
            exclusion_satisfiable=sat(cp.side_guard[(cid, "exclusion")]),
        )
        for cid in cp.cohort_ids
    ]


def eligible_trace(
    sess: Session,
    sides: list[SideStatus],
    labels: list[CriterionLabel],
    support,
    assumptions: list[Assumption],
) -> Trace:
    cp = sess.cp
    admitting = [s.cohort for s in sides if s.admits]
    assumed = {a.atom for a in assumptions if a.cls != "inert"}
    by_key = {(lb.cohort, lb.criterion): lb for lb in labels}
    steps = []
    met = deferred = 0
    for cc in cp.criteria:
        if cc.cohort not in admitting:
            continue
        lb = by_key[(cc.cohort, cc.criterion.id)]
        if lb.label == "satisfied":
            met += 1
            steps.append(_step(cc, "satisfied", facts=support[cc.index]))
        else:
            deferred += 1
            steps.append(_step(cc, "assumed", assumptions=[a for a in lb.open_atoms if a in assumed]))
    through = f"cohort {admitting[0]}" if len(admitting) == 1 else f"cohorts {', '.join(admitting)}"
    summary = (
        f"eligible through {through}: {met} criteria met by the chart, {deferred} resting on "
        f"assumptions to confirm at the visit"
    )
    return Trace(summary=summary, admitting_cohorts=admitting, steps=steps)


def ineligible_trace(sess: Session, labels: list[CriterionLabel], support) -> Trace:
    """Per cohort, a minimum set of violated criteria: those the facts violate on their own, plus
    (rarely) the fewest further criteria that conflict jointly, with the facts that violate them."""
    cp = sess.cp
    lits = sess.lits()
    by_key = {(lb.cohort, lb.criterion): lb for lb in labels}
    steps, parts = [], []
    for cid in cp.cohort_ids:
        ccs = [cc for cc in cp.criteria if cc.cohort == cid]
        violated = [cc for cc in ccs if by_key[(cid, cc.criterion.id)].label == "violated"]
        rest = [cc for cc in ccs if cc not in violated]
        extra = [] if sess.check(*[cc.pos for cc in rest], *lits) else _fewest_to_drop(sess, rest)
        steps.extend(_step(cc, "violated", facts=support[cc.index]) for cc in violated)
        keep = [cc for cc in rest if cc not in extra]
        for cc in extra:
            cone = cc.cone.union(*(k.cone for k in keep))
            facts = minimal_facts(
                sess, [cc.pos] + [k.pos for k in keep], [f for f in sess.facts if f.atom in cone]
            )
            steps.append(_step(cc, "violated", facts=facts))
        names = [cc.criterion.id for cc in violated + extra]
        parts.append(
            f"cohort {cid} fails {', '.join(names)}"
            if len(cp.cohort_ids) > 1
            else f"fails {', '.join(names)}"
        )
    return Trace(summary="ineligible: " + "; ".join(parts), steps=steps)


def _step(cc, status: str, facts=(), assumptions: list[str] | None = None) -> TraceStep:
    """One criterion's trace step, citing the facts (or naming the assumptions) it rests on."""
    return TraceStep(
        cohort=cc.cohort,
        criterion=cc.criterion.id,
        side=cc.side,
        status=status,
        text=cc.criterion.text,
        facts=[f.cite() for f in facts],
        assumptions=assumptions or [],
    )


def _fewest_to_drop(sess: Session, rest) -> list:
    """The first (in content order: text, side, id) smallest set of criteria whose removal makes the
    rest jointly satisfiable with the facts. Sizes up to 3 are searched exhaustively so the choice is
    canonical; beyond that MaxSMT picks one (noted as such in the trace summary)."""
    ordered = sorted(rest, key=lambda cc: (cc.criterion.text, cc.side, cc.criterion.id))
    lits = sess.lits()
    for k in range(1, min(3, len(ordered)) + 1):
        for combo in itertools.combinations(ordered, k):
            if sess.check(*[cc.pos for cc in ordered if cc not in combo], *lits):
                return list(combo)
    opt = z3.Optimize(ctx=sess.ctx)
    opt.set("timeout", sess.call_limit_ms())
    opt.add(sess.cp.aux)
    for f in sess.facts:
        opt.add(f.expr)
    for cc in rest:
        opt.add_soft(cc.requirement, 1)
    sess.checks += 1
    if opt.check() != z3.sat:
        return list(rest)
    m = opt.model()
    return [cc for cc in rest if not z3.is_true(m.eval(cc.requirement, model_completion=True))]
