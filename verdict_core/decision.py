"""The Decision object: d, trace γ, assumptions ρ, pivotal conditions δ, labels L, conflicts.

A Decision is a pure function of (program, patient, policy, engine version): it carries no
timings or other run-dependent data, so its canonical JSON is byte-for-byte reproducible.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from .configs import StrictModel
from .patient import Bounds, PolicyRef

Value = StrictBool | StrictInt | StrictFloat
DECISION_FORMAT = "verdict.decision/v1"
ENGINE_VERSION = "1"


class Fact(StrictModel):
    """A resolved patient value as the trace cites it."""

    atom: str
    value: Value | None = None
    bounds: Bounds | None = None
    status: Literal["observed", "imputed"]
    evidence: str | None = None
    rule: str | None = Field(default=None, description="policy rule, for imputed values")


class Interval(StrictModel):
    lo: float | None = None
    hi: float | None = None
    lo_strict: bool = False
    hi_strict: bool = False


class Requirement(StrictModel):
    """What a pivot must satisfy, stated as the trial states it (not the solver's witness)."""

    text: str = Field(description="e.g. 'creatinine (mg/dL) <= 2.0' or 'has type 2 diabetes: false'")
    value: Value | None = Field(default=None, description="bool atoms: the value it must take")
    intervals: list[Interval] = Field(default_factory=list, description="numeric atoms: union of intervals")
    exact: bool = Field(
        default=True,
        description="false when the atom occurs in nonlinear terms and the "
        "requirement is the solver's witness region only",
    )


class PivotalCondition(StrictModel):
    atom: str
    action: Literal["change", "confirm"] = Field(
        description="change a resolved fact, or confirm an open atom"
    )
    current: Value | None = Field(default=None, description="current value; null for an unresolved atom")
    current_bounds: Bounds | None = None
    target: Value = Field(description="a representative value meeting the requirement")
    requirement: Requirement


class PivotalSet(StrictModel):
    direction: Literal["to_eligible", "to_ineligible"]
    conditions: list[PivotalCondition]


class Pivotal(StrictModel):
    """δ: a minimum-cardinality set of conditions whose change flips the decision."""

    direction: Literal["to_eligible", "to_ineligible"]
    conditions: list[PivotalCondition] = Field(default_factory=list)
    alternatives: list[PivotalSet] = Field(
        default_factory=list, description="other minimum sets, canonical order"
    )
    complete: bool = Field(default=True, description="false if a solver limit cut the search short")
    note: str | None = None


class Assumption(StrictModel):
    """ρ entry (appendix A.5). forced: every admitting completion agrees (value or requirement);
    alternative: it matters, but other completions serve equally (value left open); inert: no value
    of it affects the decision."""

    atom: str
    cls: Literal["forced", "alternative", "inert"] = Field(alias="class")
    value: Value | None = None
    requirement: Requirement | None = None
    criteria: list[str] = Field(
        default_factory=list, description="criteria (cohort/criterion) that mention it"
    )
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CriterionLabel(StrictModel):
    cohort: str
    criterion: str
    side: Literal["inclusion", "exclusion"]
    label: Literal["satisfied", "violated", "deferred"]
    facts: list[str] = Field(default_factory=list, description="facts that entail the label (minimal)")
    open_atoms: list[str] = Field(
        default_factory=list, description="deferred: the unresolved atoms it waits on"
    )


class TraceStep(StrictModel):
    cohort: str
    criterion: str
    side: Literal["inclusion", "exclusion"]
    status: Literal["satisfied", "violated", "assumed"]
    text: str
    facts: list[Fact] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)


class Trace(StrictModel):
    """γ. Ineligible: per cohort a minimum set of violated criteria with the facts that violate them.
    Eligible: for the admitting cohort(s), each criterion with the facts or assumptions meeting it."""

    summary: str
    admitting_cohorts: list[str] = Field(default_factory=list)
    steps: list[TraceStep] = Field(default_factory=list)


class SideStatus(StrictModel):
    cohort: str
    admits: bool | None
    inclusion_satisfiable: bool | None
    exclusion_satisfiable: bool | None


class ExtractionConflict(StrictModel):
    """Recorded facts that cannot all be true: an extraction problem, not ineligibility. ``source``
    says what they contradict: the definitional constraints (found by the engine), or each other
    while importing recorded outputs (two threshold helpers of one atom, or the inclusion and the
    exclusion pass recording incompatible values for one atom)."""

    atoms: list[str]
    definitions: list[str]
    set_aside: list[str] = Field(description="facts treated as unresolved for this decision")
    source: Literal["definitions", "threshold_helpers", "passes"] = Field(
        default="definitions", description="what the facts contradict: the definitions, or each other"
    )
    values: list[str] = Field(
        default_factory=list,
        description="the recorded values involved, as '<where>: <atom> <value>' (no note text)",
    )

    def text(self) -> str:
        """One line for a rationale."""
        if self.source == "definitions":
            return f"{', '.join(self.atoms)} contradict definitions {', '.join(self.definitions)}"
        what = "threshold helpers" if self.source == "threshold_helpers" else "inclusion and exclusion passes"
        return (
            f"{', '.join(self.atoms)}: the recorded {what} contradict each other ({'; '.join(self.values)})"
        )


class Override(StrictModel):
    atom: str
    value: Value | None = Field(description="null = treat as unresolved")
    reason: str


class Decision(StrictModel):
    format: Literal["verdict.decision/v1"] = DECISION_FORMAT
    engine_version: str = ENGINE_VERSION
    trial_id: str
    patient_id: str
    program_hash: str
    patient_hash: str
    policy: PolicyRef | None = None
    decision: Literal["eligible", "ineligible", "undetermined"]
    reason: str | None = Field(default=None, description="why undetermined, or a note on the decision")
    cohorts: list[SideStatus] = Field(default_factory=list)
    trace: Trace
    assumptions: list[Assumption] = Field(default_factory=list)
    pivotal: Pivotal | None = None
    labels: list[CriterionLabel] = Field(default_factory=list)
    conflicts: list[ExtractionConflict] = Field(default_factory=list)
    overrides: list[Override] = Field(default_factory=list)
    incomplete: list[str] = Field(default_factory=list, description="artifacts a solver limit cut short")

    def canonical_json(self) -> str:
        return json.dumps(
            self.model_dump(mode="json", by_alias=True),
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )
