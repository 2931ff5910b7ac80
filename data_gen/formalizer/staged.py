"""Staged value mining: ask only what can change the decision (issue 23).

The exclusion side is mined first (its atoms are the ones an exclusion criterion settles on). If the
core then shows the patient ineligible under every completion of the atoms not asked yet
(`verdict.core.settled.settles`: the decision with those atoms open is ineligible, without a
conflict, and no definition ties them to an asked atom), the inclusion side is not asked: its atoms
stay unresolved with the note "not asked: the decision was already settled" (`NOT_ASKED`), which
the policy never imputes over. Otherwise the inclusion side is mined as in exhaustive mining. The
staged decision equals the exhaustive one whenever the stop rule fires (a property test, on the
reference corpus and on random programs). Completing the mining later (a review, an explicit
request) is `mine_pair(..., staged=False)`: a new decision.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from verdict.core.decision import Decision
from verdict.core.patient import MinedValue, ResolvedPatient
from verdict.core.policy import Policy, resolve
from verdict.core.program import TrialProgram
from verdict.core.settled import NOT_ASKED, settles

from ..protocol import PatientDoc, StageResult
from .checks import compact
from .miner import MinedValues, merge_sides, side_atoms

if TYPE_CHECKING:
    from verdict.core.engine import Engine

    from .runtime import Formalizer

FIRST, THEN = "exclusion", "inclusion"


@dataclass
class MinedPair:
    """Both sides of one pair: `inc`/`exc` the stages' results (a side not asked: an accepted result
    with no call whose atoms are all null), `not_asked` the atoms left unasked (atom -> why)."""

    inc: StageResult
    exc: StageResult
    not_asked: dict[str, str] = field(default_factory=dict)

    def merged(self) -> MinedValues:
        return merge_sides(self.inc.output, self.exc.output)

    def held_open(self) -> dict[str, str]:
        """atom -> note for `resolve(held_open=...)`: conflicts, unread atoms and the unasked ones."""
        return {**self.merged().held_open(), **self.not_asked}


def resolved(program: TrialProgram, patient_id: str, pair: MinedPair, policy: Policy) -> ResolvedPatient:
    """The pair's mined values resolved under `policy` (unasked, conflicting and unread atoms open)."""
    mined = pair.merged()
    return resolve(
        program, patient_id, list(mined), policy, held_open=pair.held_open(), sources=mined.sources
    )


def unasked_after_first(program: TrialProgram, skip: Collection[str] = ()) -> list[str]:
    """The atoms only the second side asks (an atom both sides use is asked with the first)."""
    first = set(side_atoms(program, FIRST))
    return [n for n in side_atoms(program, THEN) if n not in first and n not in skip]


def not_asked_result(fz: Formalizer, program: TrialProgram, side: str, names: list[str]) -> StageResult:
    """A side left unasked: accepted, no call, every atom null (`assembly.not_asked` names them)."""
    stage = f"miner_{side}"
    return StageResult(
        stage=stage,
        status="accepted",
        teacher=fz.endpoint.name,
        model=fz.endpoint.model,
        prompt_version=fz.prompt(stage).ident,
        messages=[],
        output_json=compact({"values": []}),
        output=MinedValues([MinedValue(atom=n, value=None) for n in names]),
        assembly={"calls": 0, "chunks": 0, "passages": {}, "not_asked": names},
    )


async def mine_pair(
    fz: Formalizer,
    engine: Engine,
    program: TrialProgram,
    record: PatientDoc,
    policy: Policy,
    *,
    staged: bool = True,
    skip: Collection[str] = (),
    settle=None,
) -> MinedPair:
    """Both sides of a pair; `staged`: the exclusion side first, the inclusion side only when it can
    change the decision (module docstring). `settle(patient, unasked) -> bool` replaces the stop
    rule's core check (the service applies coded FHIR facts first); default `settles`."""
    exc = await fz.mine_values(program, record, FIRST, skip=skip)
    unasked = unasked_after_first(program, skip)
    if staged and exc.accepted and unasked:
        empty = not_asked_result(fz, program, THEN, [n for n in side_atoms(program, THEN) if n not in skip])
        pair = MinedPair(empty, exc, {a: NOT_ASKED for a in unasked})
        patient = resolved(program, record.patient_id, pair, policy)
        done = settle(patient, unasked) if settle is not None else settles(program, patient, unasked, engine)
        if done:
            return pair
    inc = await fz.mine_values(program, record, THEN, skip=skip)
    return MinedPair(inc, exc)


async def decide_pair(
    fz: Formalizer,
    engine: Engine,
    program: TrialProgram,
    record: PatientDoc,
    policy: Policy,
    *,
    staged: bool = True,
) -> tuple[MinedPair, ResolvedPatient, Decision]:
    """Mine (staged or exhaustive) and decide one pair: what benchmarks and tests compare."""
    import asyncio

    pair = await mine_pair(fz, engine, program, record, policy, staged=staged)
    if not (pair.inc.accepted and pair.exc.accepted):
        raise ValueError(f"trial {program.trial_id}: a value-miner side was rejected")
    patient = resolved(program, record.patient_id, pair, policy)
    return pair, patient, await asyncio.to_thread(engine.decide, program, patient)
