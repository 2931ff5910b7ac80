"""Models of `POST /v1/screen`: who is screened against what (and where the patients came from), the
ranked answer, and the screening run's record (`GET /v1/screenings/{id}`)."""

from __future__ import annotations

import re
import unicodedata
from typing import Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from verdict.core.configs import StrictModel
from verdict.core.program import Id
from verdict.core.ranking import RankedRow

from ..contract import all_of, given, none_given, rules
from ..protocol import (
    MAX_BATCH_PATIENTS,
    POLICY_NAME,
    UNIQUE_PATIENTS,
    ErrorBody,
    PatientInput,
    base_url_problem,
    unique_patient_ids,
)

SourceKind = Literal["text", "fhir_bundle", "fhir_ndjson", "fhir_server", "omop", "patients_file", "api"]
MAX_SOURCE_LABEL = 200
WORD = r"[A-Za-z0-9][A-Za-z0-9._-]*"
LABEL_WORD = re.compile(WORD)  # a label, or each path segment of a server's URL
# What `_an_identifier` and `_fits_kind` accept, stated in the schema (the host's form is looser there)
_WORD_LABEL = {"pattern": f"^{WORD}$", "maxLength": 100}
_SERVER_LABEL = f"^[Hh][Tt][Tt][Pp][Ss]?://[A-Za-z0-9.-]+(:[0-9]{{1,5}})?(/+{WORD})*/*$"
_NAMED_BY_FILE = ("text", "fhir_bundle", "fhir_ndjson", "patients_file")  # a file or folder name, not a path


def _label_for(kinds: list[str], label: dict) -> dict:
    """For a source of one of these kinds, a given label also fits `label`."""
    return {
        "if": {"required": ["kind"], "properties": {"kind": {"enum": kinds}}},
        "then": {"properties": {"label": {"anyOf": [{"type": "null"}, {"type": "string", **label}]}}},
    }


class ScreenSource(StrictModel):
    """Where the screened patients came from, as the caller states it (recorded with the run). The
    label names the source, never a patient: a FHIR server's base URL (no credentials, query or
    fragment), an export folder or file name (no path), or an export id. Free text is refused: a
    label is an identifier (letters, digits, `.`, `_`, `-`; a URL's path segments too), so a name
    ("Jane Doe") or a sentence cannot be recorded in the audit store as a run's source."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            _label_for(["fhir_server"], {"pattern": _SERVER_LABEL}),
            _label_for([k for k in get_args(SourceKind) if k != "fhir_server"], _WORD_LABEL),
            also_checked=(
                "a fhir_server `label` is the server's base URL: http or https, a host, no credentials, "
                "query or fragment",
            ),
        )
    )

    kind: SourceKind = Field(
        description="text | fhir_bundle | fhir_ndjson | fhir_server | omop | patients_file | api"
    )
    label: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_SOURCE_LABEL,
        description="e.g. https://fhir.site.example/r4, export-2024-05, patients.jsonl, omop_cdm",
    )

    @field_validator("label")
    @classmethod
    def _an_identifier(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        if any(unicodedata.category(c).startswith("C") for c in v):
            raise ValueError("the label holds control or format characters")
        kind = info.data.get("kind")
        if kind in _NAMED_BY_FILE and ("/" in v or "\\" in v):
            raise ValueError(f"a {kind} label is a file or folder name, not a path")
        server = kind == "fhir_server"  # its scheme and host: checked below
        words = [w for w in urlsplit(v).path.split("/") if w] if server else [v]
        if not all(LABEL_WORD.fullmatch(w) for w in words) or (not server and len(v) > 100):
            raise ValueError(
                "a label is a short identifier (letters, digits, '.', '_', '-'; at most 100), not free "
                "text: it names the source (a file, folder, export id or FHIR base URL), never a patient"
            )
        return v

    @model_validator(mode="after")
    def _fits_kind(self):
        if self.label is None:
            return self
        problem = base_url_problem(self.label) if self.kind == "fhir_server" else None
        if problem:
            raise ValueError(f"a fhir_server label is the server's base URL: this one {problem}")
        return self


# An explicit list of a site's trials: as many as a screen of every registered trial may take (the
# service's `limits.max_screen_pairs` bounds the pairs either way).
MAX_SCREEN_TRIALS = 10_000


class ScreenRequest(StrictModel):
    """One patient against trials (`patient`, optional `trial_ids`), or one trial against patients
    (`trial_id` + `patients`). Exactly one of the two directions. Without `trial_ids` a patient is
    screened against every registered trial, however many (up to the service's `max_screen_pairs`)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            {
                "oneOf": [
                    all_of(given("patient"), none_given("trial_id", "patients")),
                    all_of(given("trial_id"), given("patients"), none_given("patient", "trial_ids")),
                ]
            },
            also_checked=(f"`patients`: {UNIQUE_PATIENTS}",),
        )
    )

    patient: PatientInput | None = Field(None, description="the patient to screen against the site's trials")
    trial_ids: list[Id] | None = Field(
        None,
        min_length=1,
        max_length=MAX_SCREEN_TRIALS,
        description="only these registered trials (default: every registered trial, by id)",
    )
    trial_id: Id | None = Field(None, description="the trial to screen a population against")
    patients: list[PatientInput] | None = Field(
        None,
        min_length=1,
        max_length=MAX_BATCH_PATIENTS,
        description=f"the population (with `trial_id`): {UNIQUE_PATIENTS}",
    )
    policy: str | None = Field(None, pattern=POLICY_NAME, description="policy name; default from the config")
    source: ScreenSource | None = Field(
        None, description="where the patients came from, recorded with the run (default: kind `api`)"
    )
    max_rows: int | None = Field(
        None,
        ge=1,
        description="answer only the best `max_rows` ranked rows (default: all); `tiers`, `pairs` and "
        "`failures` still cover every pair, `rows_omitted` says how many rows were left out, and the "
        "run's record lists every ranked decision, best first",
    )

    _unique = field_validator("patients")(unique_patient_ids)

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
    rows: list[ScreenRow] = Field(
        description="best first (verdict.core.ranking: tiers, then distance, then ids); the best "
        "`max_rows` when the request set it"
    )
    rows_omitted: int = Field(0, description="ranked rows past `max_rows`, not in `rows`")
    failures: list[ScreenFailure] = Field(default_factory=list)
    tiers: dict[str, int] = Field(description="ranked pairs per tier")
    pairs: int = Field(description="pairs screened (ranked + failed)")
    screening_id: str = Field(description="this run's record in the audit store: GET /v1/screenings/{id}")


class ScreeningCounts(BaseModel):
    pairs: int = Field(description="pairs screened (ranked + failed)")
    ranked: dict[str, int] = Field(description="ranked pairs per tier")
    failures: int = Field(description="pairs that could not be decided")


class ScreeningRecord(BaseModel):
    """One screening run, from the append-only audit store (audit role)."""

    screening_id: str
    created_at: float
    created_by: str = Field(description="the API key id that ran it")
    direction: Literal["patient", "trial"]
    source: ScreenSource
    counts: ScreeningCounts
    decision_ids: list[str] = Field(description="the ranked rows' decisions, best first")
    policy: dict[str, str] = Field(description="name and version")


class ScreeningSubjects(BaseModel):
    """A recorded screening run's results as FHIR R4 ResearchSubjects (admin role: for a write-back)."""

    screening_id: str
    research_subjects: list[dict] = Field(
        description="one ResearchSubject per ranked pair, best first, without `id` (the FHIR server "
        "assigns it); identifier `urn:verdict:screening-pair` is the key a write-back updates on"
    )
