"""Request and response models of `POST /v1/match` and `POST /v1/match/batch`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from verdict.core.configs import StrictModel
from verdict.core.decision import Decision
from verdict.core.patient import PolicyRef, ResolvedPatient
from verdict.core.program import Id
from verdict.data_gen.formalizer import PairCost, PassageConflict

from ..contract import exactly_one, only_with, rules
from ..protocol import (
    MAX_BATCH_PATIENTS,
    MAX_BATCH_TRIALS,
    POLICY_NAME,
    UNIQUE_PATIENTS,
    ErrorBody,
    PatientInput,
    unique_patient_ids,
)
from ..trial_versions import TrialVersion
from ..trials.protocol import TrialText


class MatchRequest(StrictModel):
    model_config = ConfigDict(
        json_schema_extra=rules(exactly_one("trial_id", "trial"), only_with("program_hash", "trial_id"))
    )

    trial_id: Id | None = Field(None, description="a trial registered with POST /v1/trials")
    program_hash: str | None = Field(
        None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="pin a version of `trial_id` (default: its active version, see TrialResponse.active)",
    )
    trial: TrialText | None = Field(
        None, description="or the criteria text inline (parsed once, then cached)"
    )
    patient: PatientInput
    policy: str | None = Field(None, pattern=POLICY_NAME, description="policy name; default from the config")

    @model_validator(mode="after")
    def _one_trial(self):
        if (self.trial_id is None) == (self.trial is None):
            raise ValueError("give exactly one of `trial_id` and `trial`")
        if self.program_hash is not None and self.trial_id is None:
            raise ValueError("`program_hash` pins a version of `trial_id`")
        return self


class ModelIds(BaseModel):
    parser: str | None = Field(
        description="parser adapter that wrote the program; null for an uploaded program"
    )
    value_miner: str
    base_model: str | None = Field(description="the adapters' base model as the server lists it")
    endpoint: str = Field(description="formalizer servers of the pool (scheme://host:port, comma-separated)")
    prompts: dict[str, str] = Field(description="prompt template version per stage")
    files: dict[str, str] = Field(
        default_factory=dict,
        description="content hash of each served model's files (the base model and each adapter, by served "
        "name): which weights answered. Empty when the service was not told their folders "
        "(api.formalizer.model_files)",
    )


class Links(BaseModel):
    decision: str
    page: str

    @classmethod
    def of(cls, decision_id: str) -> Links:
        """The decision's audit record and its clinician page."""
        return cls(decision=f"/v1/decisions/{decision_id}", page=f"/v1/decisions/{decision_id}/page")


class MatchResponse(BaseModel):
    decision_id: str
    trial_id: str
    program_hash: str
    patient_id: str
    policy: PolicyRef
    decision: Decision
    patient: ResolvedPatient = Field(description="resolved values with evidence quotes and imputations")
    rationale: dict[str, Any] = Field(description="structured rationale (criteria, to confirm, would change)")
    rationale_markdown: str
    rationale_text: str | None = Field(
        None,
        description="the verbalizer's prose restatement of the decision (api.formalizer.verbalizer); null "
        "when it is off or its output was rejected (rationale.verbalizer says why). The structured rationale "
        "and rationale_markdown are the source of truth",
    )
    extraction_conflicts: list[PassageConflict] = Field(
        default_factory=list,
        description="atoms whose documents or passages give values that cannot both hold: each value "
        "with its quote and document; the atom is left unresolved (no policy imputes over it)",
    )
    models: ModelIds
    timings_ms: dict[str, float]
    cost: PairCost = Field(
        default_factory=PairCost,
        description="what this pair cost the formalizer: model calls, prompt and completion tokens "
        "(cache hits and atoms reused from another trial are free), and the patient's one-time chart "
        "reading",
    )
    trial_cached: bool
    trial_version: TrialVersion | None = Field(
        None,
        description="the trial version decided against and whether it was the active one; a decision "
        "against an inactive version (a preview) is not the trial's decision",
    )
    links: Links


class BatchRequest(StrictModel):
    """Every patient against every trial (registered trial ids)."""

    model_config = ConfigDict(json_schema_extra=rules(also_checked=(f"`patients`: {UNIQUE_PATIENTS}",)))

    patients: list[PatientInput] = Field(
        min_length=1, max_length=MAX_BATCH_PATIENTS, description=UNIQUE_PATIENTS
    )
    trial_ids: list[Id] = Field(min_length=1, max_length=MAX_BATCH_TRIALS)
    policy: str | None = Field(None, pattern=POLICY_NAME)

    _unique = field_validator("patients")(unique_patient_ids)


class BatchLine(BaseModel):
    """One line of the NDJSON stream of /v1/match/batch, in completion order."""

    index: int = Field(description="position in patients x trial_ids (row-major)")
    patient_id: str
    trial_id: str
    status: int = Field(description="the HTTP status this pair would have had alone")
    result: MatchResponse | None = None
    error: ErrorBody | None = None
