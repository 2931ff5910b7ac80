"""The re-read's logic, apart from HTTP: `RereadService` (`app.state.rereads`).

    rereads = RereadService(reviews)                                  # serve/reviews/serving.py
    await rereads.reread(decision_id, RereadRequest(...), key)        # -> RereadResponse

The decision must be current and have room in its lineage, as for a review (409 / 422). The atoms
are checked against its program (422 naming each unknown one, with the closest name; atoms its
coded FHIR facts decided are not the chart's to read). The chart is the store's copy or the record
sent again, checked against the decision's record hash (`reviews/reading.py`). Then: the atoms are
mined against the whole chart, the atoms not asked are mined as a match mines them (`complete`, or
when the new values let them change the decision), their values replace the stored ones, the core
decides again, and the new decision supersedes the old one with a `reread` lineage (reason, key,
each atom's value before and after, what was completed) and the readings' cost. Nothing is stored
before the decision is complete: a failed or cancelled re-read leaves the store as it was, and of
two re-reads of one decision only the first to append is kept (the other gets 409, as a review).
"""

from __future__ import annotations

import asyncio
import time

from verdict.core.configs import closest
from verdict.core.program import TrialProgram
from verdict.core.settled import not_asked

from ..api_keys import KeyEntry
from ..audit import DecisionRow
from ..errors import InvalidInput
from ..reviews.protocol import Lineage
from ..reviews.reading import Mined, coded_atoms, read_changes
from ..reviews.serving import (
    ReviewService,
    Successor,
    changed_patient,
    policy_named,
    reviewed,
    stored_patient,
)
from .protocol import RereadRequest, RereadResponse


class RereadService:
    def __init__(self, reviews: ReviewService):
        self.reviews = reviews
        self.reading = reviews.reading

    async def reread(self, decision_id: str, req: RereadRequest, key: KeyEntry) -> RereadResponse:
        t_start = time.perf_counter()
        row, program = await asyncio.to_thread(self.reviews.reviewable, decision_id)
        atoms = readable_atoms(row, program, req.atoms or [])
        policy = policy_named(row.policy_name)
        stored = stored_patient(row)
        unasked = [a for a in not_asked(stored) if a not in atoms] if req.complete else []
        if not atoms and not unasked:
            raise InvalidInput(
                f"decision '{decision_id}' has no atom left unasked: its mining is complete, nothing to read",
                [("complete", "no atom of the decision is marked 'not asked'")],
            )
        record, source = self.reading.chart(row, req.patient)
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        mined: list[Mined] = []
        if atoms:
            mined.append(await self.reading.mine(program, record, atoms, whole=True))
        if unasked:
            mined.append(await self.reading.mine(program, record, unasked, whole=False))
        patient, conflicts = changed_patient(program, stored, row, policy, mined, {})
        left = await self.reading.unsettled(program, patient)
        if left:  # the new values let atoms not asked change the decision: their mining is completed
            mined.append(await self.reading.mine(program, record, left, whole=False))
            patient, conflicts = changed_patient(program, stored, row, policy, mined, {})
        timings["value_miner"] = round((time.perf_counter() - t0) * 1000, 3)
        changes = read_changes(mined, stored, patient, req.reason, key.id, list(key.roles), time.time())
        lineage = Lineage(kind="reread", parent_id=row.decision_id, changes=changes)
        successor = Successor(row, program, policy, patient, conflicts, lineage, key.id)
        stored_row, response = await self.reviews.decide_and_store(successor, timings, t_start, mined)
        completed = [a for m in mined if not m.whole for a in m.atoms]
        return reviewed(
            row, stored_row, response, RereadResponse, read=atoms, completed=completed, chart=source
        )


def readable_atoms(row: DecisionRow, program: TrialProgram, atoms: list[str]) -> list[str]:
    """`atoms`, each an atom of the program whose value comes from the chart (422 naming every
    other one: unknown, with the closest name; decided by coded FHIR facts; asked by no criterion)."""
    names = [a.name for a in program.atoms]
    sides = program.atom_sides()
    coded = coded_atoms(row)
    problems = []
    for i, a in enumerate(atoms):
        if a not in sides and a not in names:
            problems.append(
                (f"atoms.{i}", f"no atom '{a[:80]}' in the decision's program{closest(a, names)}")
            )
        elif a in coded:
            problems.append(
                (f"atoms.{i}", f"atom '{a}' was decided by the record's coded FHIR facts, not read from the "
                 "chart: correct it with a review")
            )  # fmt: skip
        elif not sides.get(a):
            problems.append(
                (f"atoms.{i}", f"atom '{a}' is used by no criterion: the value miner never asks it")
            )
    if problems:
        raise InvalidInput(
            "atoms the chart cannot be read for: " + ", ".join(f for f, _ in problems), problems
        )
    return atoms
