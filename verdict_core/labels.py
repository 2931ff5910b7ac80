"""L: per-criterion labels by three-valued entailment from the facts (and definitions).

satisfied: facts ⊨ requirement; violated: facts ⊨ ¬requirement; deferred: neither. Most labels
are settled by sound three-valued (Kleene) evaluation of the criterion on the facts; the rest by
kept models (two that disagree prove 'deferred') or an explicit solver check.

The facts cited for a label are canonical: the first single fact (in content order) that entails
the label on its own, else a deletion-minimal subset of the facts in the criterion's cone (its
atoms plus those definitions connect them to), in content order. Facts outside the cone cannot
matter once the facts are consistent, so the citation depends only on the logic, not on solver
search order or atom names.
"""

from __future__ import annotations

import z3

from .compile import CompiledCriterion
from .decision import CriterionLabel
from .formula import kleene
from .session import FactLit, Session


def minimal_facts(
    sess: Session, guards: list[z3.BoolRef], facts: list[FactLit], entails=None
) -> list[FactLit]:
    """Deletion-minimal subset of ``facts`` that keeps guards+facts unsat (facts in key order).
    ``entails(subset)`` may answer first without the solver (True = still entails)."""
    core = list(facts)
    for f in list(core):
        trial = [x for x in core if x is not f]
        if (entails and entails(trial)) or (not entails and not sess.check(*guards, *sess.lits(trial))):
            core = trial
    return core


def label_criteria(sess: Session) -> tuple[list[CriterionLabel], dict[int, list[FactLit]]]:
    cp = sess.cp
    lits = sess.lits()
    env = sess.fact_env()
    values = {cc.index: kleene(cc.criterion.formula, env) for cc in cp.criteria}
    # What three-valued evaluation leaves open goes to one `consequences` call (sound, not
    # complete: what it misses is settled by kept models or a check). Its antecedents point at
    # the fact that settles a label, which saves most citation checks.
    rest = [cc for cc in cp.criteria if values[cc.index] is None and not all(sess.seen(cc.indicator))]
    entailed = sess.consequences(lits, [cc.indicator for cc in rest]) if rest else {}
    labels: list[CriterionLabel] = []
    support: dict[int, list[FactLit]] = {}
    have = sess.fact_atoms
    for cc in cp.criteria:
        v = values[cc.index]
        got = entailed.get(cc.indicator.get_id())
        hint = None
        if v is not None:
            holds = v if cc.side == "inclusion" else not v
            label = "satisfied" if holds else "violated"
        elif got is not None:
            label, hint = ("satisfied" if got[0] else "violated"), got[1]
        else:
            label = _decide_label(sess, cc, lits)
        facts: list[FactLit] = []
        if label != "deferred":
            facts = _citation(sess, cc, label, hint)
            support[cc.index] = facts
        labels.append(
            CriterionLabel(
                cohort=cc.cohort,
                criterion=cc.criterion.id,
                side=cc.side,
                label=label,
                facts=[f.atom for f in facts],
                open_atoms=sorted((a for a in cc.cone if a not in have), key=sess.key.__getitem__)
                if label == "deferred"
                else [],
            )
        )
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


def _citation(sess: Session, cc: CompiledCriterion, label: str, hint: list[FactLit] | None) -> list[FactLit]:
    """hint: [] if the definitions alone entail the label, [f] if fact f does, None if unknown."""
    cone_facts = [f for f in sess.facts if f.atom in cc.cone]
    guard = cc.neg if label == "satisfied" else cc.pos
    want = label == "satisfied"

    def entails(subset: list[FactLit]) -> bool:
        v = kleene(cc.criterion.formula, sess.fact_env(subset))
        if v is not None:
            return (v if cc.side == "inclusion" else not v) == want
        return not sess.check(guard, *sess.lits(subset))

    # Asked even when the solver named a fact: its antecedents need not be minimal, and a label
    # the definitions alone settle cites no fact, whatever the solver's search (cached per program).
    if hint == [] or sess.cp.settled_by_definitions(cc, want, sess.check):
        return []  # the definitions alone settle it
    if len(cone_facts) == 1:
        return cone_facts
    first = hint[0] if hint else None
    for g in cone_facts:
        if g is first or entails([g]):
            return [g]
    return minimal_facts(sess, [guard], cone_facts, entails)
