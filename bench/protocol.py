"""Typed records of a benchmark run: the labelled pairs it scores and what each backend did with
each pair (one `PairResult` per backend, repeat and pair, appended to `pairs.jsonl` as it finishes).

Nothing here holds patient text except `PairResult.rationale` (the direct matcher's own words,
which may quote the note): run directories stay on site, like the notes and teacher records.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from verdict.core.configs import StrictModel
from verdict.core.errors import VerdictError

Label = Literal["eligible", "ineligible"]
DecisionValue = Literal["eligible", "ineligible", "undetermined"]
PAIR_SEP = "__"  # the paper authors' pair ids: "<patient>__<trial>"


class BenchError(VerdictError):
    """A benchmark config, dataset or run directory is unusable."""


def pair_id(patient_id: str, trial_id: str) -> str:
    return f"{patient_id}{PAIR_SEP}{trial_id}"


class LabeledPair(StrictModel):
    """One patient-trial pair of the dataset with its reference label."""

    pair_id: str
    patient_id: str
    trial_id: str
    label: Label
    source: str = Field("", description="where the label came from (file:line or file#key)")
    grade: int | None = Field(
        None, ge=0, le=2, description="the official graded judgment when the dataset has one (TREC: 2, 1, 0)"
    )
    ranking_only: bool = Field(
        False, description="decided for the ranking metrics only, never scored as a decision (TREC score 0)"
    )


class StageStat(StrictModel):
    """What one formalizer stage cost and how its output fared (no content)."""

    stage: str
    status: Literal["accepted", "rejected"]
    reason: str | None = Field(None, description="rejection category after the repair")
    first_reason: str | None = Field(
        None, description="rejection category of the first attempt (None: valid)"
    )
    attempts: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    paid_usd: float = 0.0
    model_ms: float = Field(
        0.0,
        description="latency of the calls behind the result, as recorded when they were "
        "answered (stable across resumed runs and cache hits)",
    )
    shared: bool = Field(False, description="one result for every pair of the trial (the trial parser)")


class Flip(StrictModel):
    """One formal counterfactual: the decision's primary pivotal conditions applied, decided again."""

    case: str
    direction: Literal["to_eligible", "to_ineligible"]
    flipped: bool


class FlipTarget(StrictModel):
    """What a counterfactual rewrite of the chart must address: a formal backend's primary δ
    condition (the trial's requirement, the atom, its current and target value) or a criterion the
    direct matcher stated as a reason."""

    requirement: str
    atom: str | None = None
    current: str | None = None
    target: str | None = None
    status: str | None = Field(None, description="llm_match: the criterion's stated status")


class Placement(StrictModel):
    """Where the screen puts a formal decision (`verdict.core.ranking.placement`): its tier, its
    distance and whether the pivotal search was complete. The ranking metrics order by it."""

    tier: Literal["eligible", "eligible_to_confirm", "near_miss", "ineligible", "undetermined"]
    distance: int = 0
    complete: bool = True


class PairResult(StrictModel):
    backend: str
    repeat: int = 0
    pair_id: str
    patient_id: str
    trial_id: str
    label: Label
    grade: int | None = None
    ranking_only: bool = False
    status: Literal["decided", "failed", "unavailable"]
    decision: DecisionValue | None = None
    reason: str | None = Field(None, description="why failed or unavailable (ids and categories only)")
    stages: dict[str, StageStat] = Field(default_factory=dict)
    solve_ms: float | None = None
    latency_ms: float | None = Field(
        None,
        description="the pair's own critical path: the value-miner passes "
        "(concurrent) or the direct matcher's call, plus resolving and solving",
    )
    flips: list[Flip] = Field(default_factory=list)
    program_hash: str | None = None
    patient_hash: str | None = None
    variants: int | None = Field(None, description="recorded backend: formalizations OR-ed into the decision")
    rationale: str | None = None
    placement: Placement | None = Field(None, description="formal backends: the screen's tier and distance")
    score: float | None = Field(None, description="llm_match: its own stated score of eligibility (0-100)")
    cf_direction: Literal["to_eligible", "to_ineligible"] | None = None
    cf_targets: list[FlipTarget] = Field(
        default_factory=list, description="flip targets for the end-to-end counterfactual stage"
    )

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.backend, self.repeat, self.pair_id)


class CfRecord(StrictModel):
    """One end-to-end counterfactual (paper appendix D.1): the chart rewritten for the flip targets,
    validated, and the same matcher run again on it. Ids, categories and stage stats only."""

    backend: str
    pair_id: str
    patient_id: str
    trial_id: str
    direction: Literal["to_eligible", "to_ineligible"]
    targets: int
    status: Literal["flipped", "not_flipped", "rejected", "failed"] = Field(
        description="rejected: the validator refused the rewrite (left out of SF_raw); failed: a "
        "stage's output stayed invalid, or the rerun failed"
    )
    reason: str | None = None
    decision_after: DecisionValue | None = None
    stages: dict[str, StageStat] = Field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.backend, self.pair_id, self.direction)
