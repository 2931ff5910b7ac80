"""Models of `POST /v1/screen`: who is screened against what, and the ranked answer."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from verdict_core.program import Id
from verdict_core.ranking import RankedRow

from ..protocol import MAX_BATCH_PATIENTS, MAX_BATCH_TRIALS, POLICY_NAME, ErrorBody, PatientInput, _Strict


class ScreenRequest(_Strict):
    """One patient against trials (`patient`, optional `trial_ids`), or one trial against patients
    (`trial_id` + `patients`). Exactly one of the two directions."""

    patient: PatientInput | None = Field(None, description="the patient to screen against the site's trials")
    trial_ids: list[Id] | None = Field(
        None, min_length=1, max_length=MAX_BATCH_TRIALS,
        description="only these registered trials (default: every registered trial, by id)")
    trial_id: Id | None = Field(None, description="the trial to screen a population against")
    patients: list[PatientInput] | None = Field(
        None, min_length=1, max_length=MAX_BATCH_PATIENTS, description="the population (with `trial_id`)")
    policy: str | None = Field(None, pattern=POLICY_NAME, description="policy name; default from the config")

    @model_validator(mode="after")
    def _one_direction(self):
        by_patient = self.patient is not None
        by_trial = self.trial_id is not None or self.patients is not None
        if by_patient == by_trial:
            raise ValueError("give `patient` (with optional `trial_ids`), or `trial_id` with `patients`")
        if by_trial and (self.trial_id is None or self.patients is None):
            raise ValueError("screening a trial needs both `trial_id` and `patients`")
        if by_trial and self.trial_ids is not None:
            raise ValueError("`trial_ids` filters the trials of a patient screen")
        return self

    @property
    def direction(self) -> Literal["patient", "trial"]:
        return "patient" if self.patient is not None else "trial"


class ScreenLinks(BaseModel):
    decision: str
    page: str


class ScreenRow(RankedRow):
    """A ranked pair, with its recorded decision."""

    decision_id: str
    program_hash: str
    links: ScreenLinks


class ScreenFailure(BaseModel):
    """A pair that could not be decided (it has no rank): its own error, the others go on."""

    trial_id: str
    patient_id: str
    status: int = Field(description="the HTTP status this pair would have had alone")
    error: ErrorBody


class ScreenResponse(BaseModel):
    direction: Literal["patient", "trial"]
    rows: list[ScreenRow] = Field(description="best first (verdict_core.ranking: tiers, then distance, then ids)")
    failures: list[ScreenFailure] = Field(default_factory=list)
    tiers: dict[str, int] = Field(description="ranked pairs per tier")
    pairs: int = Field(description="pairs screened (ranked + failed)")
