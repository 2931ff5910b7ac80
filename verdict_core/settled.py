"""A decision settled before every atom is read: ineligible under every completion of the atoms not
asked yet. Staged value mining (`verdict.data_gen.formalizer.staged`) stops asking there.

`settles(program, patient, unasked)` decides the patient with the unasked atoms open (unresolved:
the solver may give them any value). Ineligible then means no completion admits the patient, since
a completion only adds facts. Two things could still let a later fact undo it, and both make the
answer "not settled": a fact that conflicts with the definitions is set aside by the engine, so
the open decision must have no conflict, and no definition may tie an unasked atom to an asked one
(a new fact could then conflict with an asked fact and have it set aside).
"""

from __future__ import annotations

from collections.abc import Collection

from .formula import atoms_in
from .patient import Resolution, ResolvedPatient
from .program import TrialProgram

NOT_ASKED = "not asked: the decision was already settled"
# How a decision's δ_E says it rests on atoms left unasked (the engine writes it, the ranking reads it).
RESTS_ON_UNASKED = "rests on atoms not asked"


def not_asked(patient: ResolvedPatient) -> list[str]:
    """The atoms staged mining left unasked (unresolved with the `NOT_ASKED` note)."""
    return [r.atom for r in patient.resolutions if r.status == "unresolved" and r.note == NOT_ASKED]


def unasked_note(atoms: list[str]) -> str:
    """The δ_E note of a decision some of whose atoms were not asked: it may understate the change
    needed (those atoms are free in it; completing the mining may add conditions)."""
    return (
        f"{RESTS_ON_UNASKED} ({len(atoms)}: {', '.join(atoms)}); the decision was settled before they "
        "were read, so completing the mining may add conditions"
    )


def with_open(patient: ResolvedPatient, atoms: Collection[str], note: str = NOT_ASKED) -> ResolvedPatient:
    """The patient with these atoms unresolved (whatever they were), each with `note`."""
    atoms = set(atoms)
    rs = [
        Resolution(atom=r.atom, status="unresolved", note=note) if r.atom in atoms else r
        for r in patient.resolutions
    ]
    have = {r.atom for r in rs}
    rs += [Resolution(atom=a, status="unresolved", note=note) for a in sorted(atoms - have)]
    return patient.model_copy(update={"resolutions": rs})


def tied_by_definitions(program: TrialProgram, unasked: Collection[str]) -> bool:
    """Whether a definition mentions both an unasked atom and an asked one."""
    unasked = set(unasked)
    for d in program.definitions:
        names = atoms_in(d.formula)
        if names & unasked and names - unasked:
            return True
    return False


def settles(program: TrialProgram, patient: ResolvedPatient, unasked: Collection[str], engine=None) -> bool:
    """Whether `patient` is ineligible under every completion of the `unasked` atoms (see the
    module docstring for the rule). `engine`: the caller's (its solver limit); a solver limit is
    "not settled"."""
    if tied_by_definitions(program, unasked):
        return False
    if engine is None:
        from .engine import Engine

        engine = Engine()
    d = engine.decide(program, with_open(patient, unasked))
    return d.decision == "ineligible" and not d.conflicts
