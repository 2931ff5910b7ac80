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

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verdict.core.decision import Decision
from verdict.core.patient import MinedValue, ResolvedPatient
from verdict.core.policy import Policy, resolve
from verdict.core.program import TrialProgram
from verdict.core.settled import NOT_ASKED, settles

from .checks import compact
from .findings import MinedValues, merge_sides
from .miner_prompt import side_atoms
from .protocol import PatientDoc, StageResult

if TYPE_CHECKING:
    from verdict.core.engine import Engine

    from .stages import Formalizer

FIRST, THEN = "exclusion", "inclusion"


def not_asked_marks(*results: StageResult) -> dict[str, str]:
    """atom -> `NOT_ASKED` for the atoms a side left unasked (`assembly.not_asked`)."""
    return {a: NOT_ASKED for r in results for a in (r.assembly or {}).get("not_asked", [])}


def held_open(inc: StageResult, exc: StageResult) -> dict[str, str]:
    """atom -> note for `resolve(held_open=...)`: conflicts, unread atoms and the unasked ones."""
    return {**merge_sides(inc.output, exc.output).held_open(), **not_asked_marks(inc, exc)}


@dataclass
class MinedPair:
    """Both sides of one pair: `inc`/`exc` the stages' results (a side not asked: an accepted result
    with no call whose atoms are all null, `assembly.not_asked` naming the unasked ones)."""

    inc: StageResult
    exc: StageResult

    @property
    def not_asked(self) -> dict[str, str]:
        return not_asked_marks(self.inc, self.exc)

    def merged(self) -> MinedValues:
        return merge_sides(self.inc.output, self.exc.output)

    def held_open(self) -> dict[str, str]:
        return held_open(self.inc, self.exc)


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


def not_asked_result(
    fz: Formalizer, program: TrialProgram, side: str, names: list[str], unasked: list[str]
) -> StageResult:
    """A side left unasked: accepted, no call, every atom null; `assembly.not_asked` names the atoms no
    side asked (`unasked`; an atom the first side shares was asked there)."""
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
        assembly={"calls": 0, "chunks": 0, "passages": {}, "not_asked": unasked},
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
    mine: Callable[[str], Awaitable[StageResult]] | None = None,
    settle: Callable[[ResolvedPatient, list[str]], bool] | None = None,
) -> MinedPair:
    """Both sides of a pair; `staged`: the exclusion side first, the inclusion side only when it can
    change the decision (module docstring), else both at once. `mine(side)`: how a side is mined
    (the service wraps `fz.mine_values` in its failure mapping); `settle(patient, unasked)`: the stop
    rule's core check (the service applies coded FHIR facts first); default `settles`."""
    ask = mine or (lambda side: fz.mine_values(program, record, side, skip=skip))
    if not staged:
        inc, exc = await asyncio.gather(ask(THEN), ask(FIRST))
        return MinedPair(inc, exc)
    exc = await ask(FIRST)
    unasked = unasked_after_first(program, skip)
    if exc.accepted and unasked:
        names = [n for n in side_atoms(program, THEN) if n not in skip]
        pair = MinedPair(not_asked_result(fz, program, THEN, names, unasked), exc)
        patient = resolved(program, record.patient_id, pair, policy)
        check = settle or (lambda p, u: settles(program, p, u, engine))
        if await asyncio.to_thread(check, patient, unasked):
            return pair
    return MinedPair(await ask(THEN), exc)


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
    pair = await mine_pair(fz, engine, program, record, policy, staged=staged)
    if not (pair.inc.accepted and pair.exc.accepted):
        raise ValueError(f"trial {program.trial_id}: a value-miner side was rejected")
    patient = resolved(program, record.patient_id, pair, policy)
    return pair, patient, await asyncio.to_thread(engine.decide, program, patient)
