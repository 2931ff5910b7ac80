"""Extraction conflicts: facts that contradict the definitional constraints (appendix A.4).

Such a contradiction says the value miner misread the chart, not that the patient is ineligible,
so it is reported apart. Every fact that takes part in *some* minimal conflict is set aside
(treated as unresolved, to be confirmed) for this decision: the union of all minimal conflicts
equals the union of all minimal correction sets, which we enumerate per connected group of
definitions. Setting aside the whole union, not one solver-chosen culprit, keeps the result
independent of search order and atom names. (The paper authors' evaluator instead drops one
value that contradicts a definitional equality; an optional arbiter can propose overrides first.)
"""

from __future__ import annotations

import z3

from .decision import ExtractionConflict
from .session import FactLit, Session

MAX_CORRECTION_SETS = 64


def find_conflicts(sess: Session) -> tuple[list[ExtractionConflict], set[str]]:
    """Conflicts per inconsistent definition group, and the atoms whose facts are set aside."""
    cp = sess.cp
    groups: dict[frozenset[str], list[FactLit]] = {}
    for f in sess.facts:
        groups.setdefault(cp.component.get(f.atom, frozenset([f.atom])), []).append(f)
    conflicts: list[ExtractionConflict] = []
    aside: set[str] = set()
    for comp, facts in sorted(groups.items(), key=lambda kv: sess.key[kv[1][0].atom]):
        if sess.check(*sess.lits(facts)):
            continue
        culprits = _union_of_correction_sets(sess, facts)
        defs = sorted(d for d, _, names in cp.definitions if names & culprits and names <= comp)
        ordered = sorted(culprits, key=sess.key.__getitem__)
        conflicts.append(ExtractionConflict(atoms=ordered, definitions=defs, set_aside=ordered))
        aside |= culprits
    return conflicts, aside


def _union_of_correction_sets(sess: Session, facts: list[FactLit]) -> set[str]:
    ctx = sess.ctx
    s2 = z3.Solver(ctx=ctx)
    s2.set("timeout", sess.call_limit_ms())
    s2.add(sess.cp.aux)
    sel = {}
    for i, f in enumerate(facts):
        sel[f.atom] = z3.Bool(f"!sel{i}", ctx)
        s2.add(z3.Implies(sel[f.atom], f.expr))
    union: set[str] = set()
    for _ in range(MAX_CORRECTION_SETS):
        sess.checks += 1
        r = s2.check()
        if r == z3.unsat:
            break
        if r != z3.sat:
            union |= {f.atom for f in facts}  # no answer: set the whole group aside, say so via the conflict
            break
        m = s2.model()
        keep = [f.atom for f in facts if z3.is_true(m.eval(sel[f.atom], model_completion=True))]
        for f in facts:  # grow to a maximal satisfiable subset in content order
            if f.atom in keep:
                continue
            sess.checks += 1
            if s2.check(*[sel[a] for a in keep + [f.atom]]) == z3.sat:
                keep.append(f.atom)
        correction = {f.atom for f in facts} - set(keep)
        if not correction:
            break
        union |= correction
        s2.add(z3.Or([sel[a] for a in correction]))
    return union
