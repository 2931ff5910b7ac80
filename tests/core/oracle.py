"""A brute-force oracle for small programs: enumerate every completion on a grid that covers every
cell of every numeric atom (constants are integers 0..5 in the generated programs), and answer the
engine's questions by definition. Slow and obviously right; used only by the property tests."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from verdict.core.formula import evaluate
from verdict.core.patient import Resolution
from verdict.core.program import TrialProgram

INT_GRID = list(range(-1, 7))
REAL_GRID = [x / 2 for x in range(-1, 12)]  # -0.5, 0, 0.5, ..., 5.5


def domain(atom) -> list:
    return [False, True] if atom.domain == "bool" else (INT_GRID if atom.domain == "int" else REAL_GRID)


def snap(v):
    """The grid point in the same cell as v (thresholds are the integers 0..5)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return -1 if v < 0 else (6 if v > 5 else v)
    if v < 0:
        return -0.5
    if v > 5:
        return 5.5
    return v if float(v).is_integer() else int(v) + 0.5


def fact_holds(r: Resolution, v) -> bool:
    if r.bounds is not None:
        return r.bounds.contains(v)
    return v == snap(r.value)


@dataclass
class World:
    env: dict
    defs: bool  # the definitions hold
    admitted: bool  # some cohort's requirements hold
    req: dict  # (cohort, criterion) -> requirement value


class Oracle:
    def __init__(self, program: TrialProgram):
        self.program = program
        self.atoms = program.atoms
        names = [a.name for a in self.atoms]
        self.worlds: list[World] = []
        for values in itertools.product(*(domain(a) for a in self.atoms)):
            env = dict(zip(names, values))
            defs = all(evaluate(d.formula, env) for d in program.definitions)
            req = {}
            for cohort, side, cr in program.criteria():
                v = bool(evaluate(cr.formula, env))
                req[(cohort.id, cr.id)] = v if side == "inclusion" else not v
            admitted = any(
                all(req[(c.id, cr.id)] for cr in c.inclusion + c.exclusion) for c in program.cohorts
            )
            self.worlds.append(World(env, defs, admitted, req))

    def matching(self, facts: dict[str, Resolution]) -> list[World]:
        return [w for w in self.worlds if all(fact_holds(r, w.env[a]) for a, r in facts.items())]

    def consistent(self, facts) -> bool:
        return any(w.defs for w in self.matching(facts))

    def eligible(self, facts) -> bool:
        return any(w.defs and w.admitted for w in self.matching(facts))

    def label(self, facts, key) -> str:
        vals = {w.req[key] for w in self.matching(facts) if w.defs}
        return "satisfied" if vals == {True} else "violated" if vals == {False} else "deferred"

    def admissible_values(self, facts, atom: str) -> set:
        return {w.env[atom] for w in self.matching(facts) if w.defs and w.admitted}

    def depends(self, facts, atom: str) -> bool:
        """Some consistent patient's admission changes with `atom` alone."""
        groups: dict[tuple, set] = {}
        for w in self.matching(facts):
            if w.defs:
                key = tuple(sorted((k, v) for k, v in w.env.items() if k != atom))
                groups.setdefault(key, set()).add(w.admitted)
        return any(len(v) > 1 for v in groups.values())

    def flip_exists(self, facts: dict[str, Resolution], size: int, eligible_now: bool) -> bool:
        """Is there a change of `size` atoms that flips the decision (unmentioned atoms keep their
        status, the changed patient stays consistent with the definitions)?"""
        table = {a.name: a for a in self.atoms}
        # eligible: facts may change and open atoms may be confirmed; ineligible: only facts change
        choices = list(table) if eligible_now else list(facts)
        for combo in itertools.combinations(choices, size):
            for values in itertools.product(*(domain(table[a]) for a in combo)):
                new = dict(facts)
                for a, v in zip(combo, values):
                    new[a] = Resolution(atom=a, status="observed", value=v, evidence="cf")
                if not self.consistent(new):
                    continue
                if self.eligible(new) != eligible_now:
                    return True
        return False
