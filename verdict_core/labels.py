"""L: per-criterion labels by three-valued entailment from the facts (and definitions).

satisfied: facts ⊨ requirement; violated: facts ⊨ ¬requirement; deferred: neither. All labels
come from one `consequences` call. The facts cited for a label are canonical: the first single
fact (in content order) that entails the label on its own, else a deletion-minimal subset of the
facts in the criterion's cone (its atoms plus those definitions connect them to), again in
content order. Facts outside the cone cannot matter once the facts are consistent, so the
citation depends only on the logic, not on solver search order or atom names.
"""

from __future__ import annotations

import z3

from .compile import CompiledCriterion
from .decision import CriterionLabel
from .session import FactLit, Session


def minimal_facts(sess: Session, guards: list[z3.BoolRef], facts: list[FactLit]) -> list[FactLit]:
    """Deletion-minimal subset of ``facts`` that keeps guards+facts unsat (facts in key order)."""
    core = list(facts)
    for f in list(core):
        trial = [x for x in core if x is not f]
        if not sess.check(*guards, *sess.lits(trial)):
            core = trial
    return core


def label_criteria(sess: Session) -> tuple[list[CriterionLabel], dict[int, list[FactLit]]]:
    cp = sess.cp
    lits = sess.lits()
    # One `consequences` call settles most labels; it is sound but not complete (it can miss
    # entailments through arithmetic), so anything it leaves open is confirmed by two models
    # that disagree on the criterion, or decided by an explicit check.
    entailed = sess.consequences(lits, [cc.indicator for cc in cp.criteria])
    labels: list[CriterionLabel] = []
    support: dict[int, list[FactLit]] = {}
    have = sess.fact_atoms
    for cc in cp.criteria:
        got = entailed.get(cc.indicator.get_id())
        if got is not None:
            label, antecedent = ("satisfied" if got[0] else "violated"), got[1]
        else:
            label, antecedent = _decide_label(sess, cc, lits), None
        facts: list[FactLit] = []
        if label != "deferred":
            facts = _citation(sess, cc, label, antecedent)
            support[cc.index] = facts
        labels.append(CriterionLabel(
            cohort=cc.cohort, criterion=cc.criterion.id, side=cc.side, label=label,
            facts=[f.atom for f in facts],
            open_atoms=sorted((a for a in cc.cone if a not in have), key=sess.key.__getitem__) if label == "deferred" else [],
        ))
    return labels, support


def _decide_label(sess: Session, cc: CompiledCriterion, lits) -> str:
    can_true, can_false = sess.seen(cc.indicator)
    if can_true and can_false:
        return "deferred"
    if not can_true:
        if not sess.check(cc.pos, *lits):
            return "violated"
        sess.model()
        if can_false:
            return "deferred"
    if not sess.check(cc.neg, *lits):
        return "satisfied"
    sess.model()
    return "deferred"


def _citation(sess: Session, cc: CompiledCriterion, label: str, antecedent: list[FactLit] | None) -> list[FactLit]:
    if antecedent == []:
        return []  # the definitions alone settle it
    cone_facts = [f for f in sess.facts if f.atom in cc.cone]
    guard = cc.neg if label == "satisfied" else cc.pos
    if antecedent is None and (not cone_facts or not sess.check(guard)):
        return []
    if len(cone_facts) == 1:
        return cone_facts
    first = antecedent[0] if antecedent and len(antecedent) == 1 else None
    for g in cone_facts:
        if g is first or not sess.check(guard, g.lit):
            return [g]
    return minimal_facts(sess, [guard], cone_facts)
