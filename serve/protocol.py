"""Request and response models of the matching API (the OpenAPI schema is generated from these).

Strict (`extra="forbid"`), with limits on every text field, so that a malformed request is a 422
naming each invalid field, never a 500. Patient text comes in `PatientInput.note`, `.notes` or
`.fhir` (its documents) only. The rules the models check across fields are in the schema too
(`serve/contract.py`), so that a request valid by the document is one the service accepts.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from verdict.core.configs import StrictModel
from verdict.core.decision import Decision
from verdict.core.patient import PolicyRef, ResolvedPatient
from verdict.core.program import Id, TrialProgram
from verdict.data_gen.fhir.models import FhirPatientRecord
from verdict.data_gen.formalizer.accounting import PairCost
from verdict.data_gen.formalizer.miner import PassageConflict
from verdict.data_gen.protocol import SINGLE_NOTE_ID, NoteDocument

from .contract import all_of, any_given, exactly_one, given, only_with, outline, rules
from .trial_versions import TrialVersion

# Policy *names* only: a path would let a caller read files of the server.
POLICY_NAME = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
MAX_NOTE_CHARS = 100_000
# A hospital chart: hundreds of documents, 20k-128k tokens (a 128k-token chart is about 500k
# characters). The chart is read once per patient (data_gen/formalizer/reader.py), so its length no
# longer multiplies the per-trial cost; these bound one request's memory, not the reading.
MAX_NOTES = 1000  # documents per patient
MAX_RECORD_CHARS = 2_000_000  # all documents of one patient
MAX_CRITERIA_CHARS = 60_000
MAX_BATCH_PATIENTS = 1000
MAX_BATCH_TRIALS = 200


_Strict = StrictModel  # the project's one strict base, under the name serve/screen imports
_ID_SCHEMA = TypeAdapter(Id).json_schema()
ISO_DATE = r"^(?!0000)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"  # fromisoformat's YYYY-MM-DD
BIRTH_DATE = r"^(?!0000)[0-9]{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?)?$"  # FHIR's partial dates
# a character str.strip() keeps: Python's \s has \x1c-\x1f and \x85, ECMA's (the document's) has not
NOT_BLANK = r"[^\s\x1c-\x1f\x85]"


# A trial program as a plain object, checked by the core's TrialProgram model in the service (422s
# name `program.<path>`); the document states its outline (TrialProgram's schema down to each
# formula's operator), so `{}` is not valid by it.
ProgramObject = Annotated[dict[str, Any], WithJsonSchema(outline(TrialProgram.model_json_schema()))]
PROGRAM_CHECKS = (
    "`program`: each formula is one of the formula language (`verdict schema program` writes its full "
    "JSON Schema; this document states each formula's operator only), and the core's checks: every "
    "atom used is declared with a fitting domain, atom names and criterion, cohort and definition ids "
    "are unique, source criteria exist, a stated content_hash matches, formulas are nested at most 64 "
    "levels",
)


# ---- errors -------------------------------------------------------------------------------------
class Problem(BaseModel):
    field: str = Field(description="where, e.g. 'patient.note' or 'program.cohorts.0.inclusion.1.formula'")
    message: str


class ErrorBody(BaseModel):
    error: str = Field(description="machine-readable code, e.g. invalid_request, formalizer_unavailable")
    message: str
    problems: list[Problem] = Field(default_factory=list)


# ---- trials -------------------------------------------------------------------------------------
def _path(*keys: str, leaf: dict) -> dict:
    """An object that has the nested keys, the last holding `leaf`."""
    schema = leaf
    for k in reversed(keys):
        schema = {"type": "object", "required": [k], "properties": {k: schema}}
    return schema


def _study(protocol: str, ident: str, nct: str, elig: str, criteria: str) -> dict:
    text = {"type": "string", "pattern": NOT_BLANK}
    return _path(
        protocol,
        leaf={
            "type": "object",
            "required": [ident, elig],
            "properties": {
                ident: _path(nct, leaf=_ID_SCHEMA),  # it becomes the trial id
                elig: _path(criteria, leaf=text),
            },
        },
    )


# What the service's ClinicalTrials.gov reader needs of a study, in the two layouts it reads.
_CTGOV_V2 = _study(
    "protocolSection", "identificationModule", "nctId", "eligibilityModule", "eligibilityCriteria"
)
_CTGOV_CLASSIC = _path(
    "FullStudy",
    "Study",
    leaf=_study(
        "ProtocolSection", "IdentificationModule", "NCTId", "EligibilityModule", "EligibilityCriteria"
    ),
)


class TrialText(_Strict):
    """Eligibility criteria as text: one `criteria` block, or `inclusion` and/or `exclusion`."""

    model_config = ConfigDict(
        json_schema_extra=rules(exactly_one("criteria", any_given("inclusion", "exclusion")))
    )

    trial_id: Id | None = Field(None, description="e.g. an NCT id; default: derived from the text")
    title: str = Field("", max_length=1000)
    criteria: str | None = Field(None, min_length=1, max_length=MAX_CRITERIA_CHARS)
    inclusion: str | None = Field(None, min_length=1, max_length=MAX_CRITERIA_CHARS)
    exclusion: str | None = Field(None, min_length=1, max_length=MAX_CRITERIA_CHARS)

    @model_validator(mode="after")
    def _some_text(self):
        if self.criteria is None and self.inclusion is None and self.exclusion is None:
            raise ValueError("give `criteria`, or `inclusion` and/or `exclusion`")
        if self.criteria is not None and (self.inclusion is not None or self.exclusion is not None):
            raise ValueError("give either `criteria` or `inclusion`/`exclusion`, not both")
        return self


class TrialRequest(_Strict):
    """Exactly one of: criteria text, a ClinicalTrials.gov study record, a reviewed program."""

    model_config = ConfigDict(
        json_schema_extra=rules(exactly_one("text", "ctgov_study", "program"), also_checked=PROGRAM_CHECKS)
    )

    text: TrialText | None = None
    ctgov_study: dict[str, Any] | None = Field(
        None,
        description="one ClinicalTrials.gov study record with an NCT id and eligibility criteria: API v2 "
        "JSON, or the classic API's layout (FullStudy.Study.ProtocolSection; keys are read "
        "case-insensitively)",
        json_schema_extra={"anyOf": [_CTGOV_V2, _CTGOV_CLASSIC, {"type": "null"}]},
    )
    program: ProgramObject | None = Field(
        None,
        description="a reviewed trial program (admin role), format verdict.trial_program/v1: see "
        "`verdict schema program`",
    )

    @model_validator(mode="after")
    def _exactly_one(self):
        given = [k for k in ("text", "ctgov_study", "program") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of `text`, `ctgov_study`, `program` (got {given or 'none'})")
        return self


class TrialResponse(BaseModel):
    trial_id: str
    program_hash: str
    origin: Literal["parser", "upload", "revision"] = Field(
        description="parser: the trial parser's output (match role); upload: a reviewed program "
        "(admin role); revision: a corrected program (trial_owner or admin, POST /v1/trials/{id}/revisions)"
    )
    active: bool = Field(
        description="whether matches on trial_id use this version: the newest reviewed version is active, "
        "else the newest parser version; a parser run never supersedes a reviewed one"
    )
    active_program_hash: str = Field(description="the version matches on trial_id use now")
    cached: bool = Field(description="true when the program came from the parse cache (no model call)")
    parser_model: str | None = None
    prompt_version: str | None = None
    created_at: float
    program: TrialProgram


# ---- matching -----------------------------------------------------------------------------------
class NoteInput(_Strict):
    """One document of the patient record."""

    id: Id = Field(description="the document's id: each evidence quote names the document it is from")
    text: str = Field(
        min_length=1,
        max_length=MAX_NOTE_CHARS,
        description="the document text (stays on site); not blank",
        json_schema_extra={"pattern": NOT_BLANK},  # what `_not_blank` enforces, stated in the schema
    )
    date: str | None = Field(
        None, pattern=r"^\d{4}-\d{2}-\d{2}", max_length=40, description="ISO date, if known"
    )
    kind: str | None = Field(None, max_length=64, description="e.g. discharge_summary, radiology, lab")

    @field_validator("text")
    @classmethod
    def _not_blank(cls, text: str) -> str:
        if not text.strip():  # nothing to read: a clear refusal, not a wasted model call
            raise ValueError("the document is blank (only whitespace)")
        return text


MAX_FHIR_FACTS = 5000  # coded facts per FHIR patient record
# The limits `_check_fhir` applies to a FHIR record, stated beside its (shared) schema.
_FHIR_INPUT = all_of(
    {
        "properties": {
            "patient_id": _ID_SCHEMA,
            "reference_date": {"type": "string", "pattern": ISO_DATE},
            "birth_date": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": BIRTH_DATE}]},
            "documents": {
                "minItems": 1,
                "maxItems": MAX_NOTES,
                "items": {
                    "properties": {
                        "id": _ID_SCHEMA,
                        "text": {"maxLength": MAX_NOTE_CHARS},
                        "date": {
                            "anyOf": [{"type": "null"}, {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}"}]
                        },
                    }
                },
            },
            "facts": {"maxItems": MAX_FHIR_FACTS},
        },
        "required": ["documents"],
    },
    only_with("age_years", "birth_date"),
    only_with("age_range", "birth_date"),
    {"not": all_of(given("age_years"), given("age_range"))},
)


class PatientInput(_Strict):
    """The patient record: one `note`, several documents in `notes`, or a FHIR patient record in
    `fhir` (exactly one of the three)."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            exactly_one("note", "notes", "fhir"),
            also_checked=(
                "document ids are unique within `notes` and within `fhir.documents`",
                f"`notes` and `fhir.documents` hold at most {MAX_RECORD_CHARS} characters in all",
                "`fhir.patient_id` equals `patient_id`",
                "`fhir.reference_date` and `fhir.birth_date` are calendar dates (a birth date may be YYYY or "
                "YYYY-MM); `fhir.age_years` / `fhir.age_range` are the age they give (age_years for an exact "
                "birth date, age_range for a partial one, neither for a birth date after the reference date)",
                "`fhir.reference_date` is a plausible reference date (the site's configs/fhir/codes.yaml "
                "`dates`: by default from 1900-01-01 to 366 days after today)",
            ),
        )
    )

    patient_id: Id
    note: str | None = Field(
        None, min_length=1, max_length=MAX_NOTE_CHARS, description="the patient note (stays on site)"
    )
    notes: list[NoteInput] | None = Field(
        None,
        min_length=1,
        max_length=MAX_NOTES,
        description="several documents, each with its id (a long document is read in passages)",
    )
    fhir: FhirPatientRecord | None = Field(
        None,
        description="a patient read from FHIR R4 (format verdict.fhir_patient/v1, as `verdict fhir load "
        "--out` writes it): its documents are the miner's; atoms its coded facts decide (coded labs, age "
        "at reference_date) are not asked of the miner and their evidence names the resource",
        json_schema_extra=_FHIR_INPUT,
    )

    @model_validator(mode="after")
    def _one_record(self):
        given = [k for k in ("note", "notes", "fhir") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of `note` and `notes`, or `fhir` (got {given or 'none'})")
        if self.fhir is not None:
            _check_fhir(self.patient_id, self.fhir)
        if self.notes is not None:
            ids = [d.id for d in self.notes]
            dup = sorted({i for i in ids if ids.count(i) > 1})
            if dup:
                raise ValueError(f"duplicate document id(s) in `notes`: {', '.join(dup[:10])}")
            if sum(len(d.text) for d in self.notes) > MAX_RECORD_CHARS:
                raise ValueError(f"`notes` hold more than {MAX_RECORD_CHARS} characters in all")
        return self

    def documents(self) -> list[NoteDocument]:
        """The record as the value miner reads it: `note` is the one document 'note'."""
        if self.fhir is not None:
            return list(self.fhir.documents)
        if self.notes is None:
            return [NoteDocument(id=SINGLE_NOTE_ID, text=self.note or "")]
        return [NoteDocument(id=d.id, text=d.text, date=d.date, kind=d.kind) for d in self.notes]


_ID = TypeAdapter(Id)


def _check_fhir(patient_id: str, rec: FhirPatientRecord) -> None:
    """The FHIR record fits the same limits as `notes`, and its dates and age agree (the age decides
    atoms without the miner): problems by field, never by content."""
    import datetime as dt

    from verdict.data_gen.fhir.records import age_at
    from verdict.data_gen.fhir.resolve import default_code_map

    if rec.patient_id != patient_id:
        raise ValueError("`fhir.patient_id` must equal `patient_id`")
    if not rec.documents:
        raise ValueError(
            "`fhir.documents` is empty: the record has no DocumentReference or DiagnosticReport "
            "text for the value miner"
        )
    if len(rec.documents) > MAX_NOTES or len(rec.facts) > MAX_FHIR_FACTS:
        raise ValueError(f"`fhir` holds more than {MAX_NOTES} documents or {MAX_FHIR_FACTS} facts")
    ids = [d.id for d in rec.documents]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate document id(s) in `fhir.documents`")
    for i, d in enumerate(rec.documents):  # the same rules as `notes` (ids are evidence sources)
        try:
            _ID.validate_python(d.id)
        except ValidationError:
            raise ValueError(f"`fhir.documents.{i}.id` is not a valid document id") from None
        if d.date is not None and not re.match(r"^\d{4}-\d{2}-\d{2}", d.date):
            raise ValueError(f"`fhir.documents.{i}.date` is not an ISO date")
    if (
        any(len(d.text) > MAX_NOTE_CHARS for d in rec.documents)
        or sum(len(d.text) for d in rec.documents) > MAX_RECORD_CHARS
    ):
        raise ValueError(
            f"`fhir.documents` exceed {MAX_NOTE_CHARS} characters per document or {MAX_RECORD_CHARS} in all"
        )
    try:
        at = dt.date.fromisoformat(rec.reference_date)
    except ValueError:
        raise ValueError("`fhir.reference_date` is not an ISO date YYYY-MM-DD") from None
    implausible = default_code_map().dates.reference_date_problem(at)
    if implausible:
        raise ValueError(f"`fhir.reference_date` is {implausible} (plausible dates: configs/fhir/codes.yaml)")
    span = None
    if rec.birth_date is not None:
        try:
            span = age_at(rec.birth_date, at)
        except ValueError:
            raise ValueError("`fhir.birth_date` is not a date YYYY, YYYY-MM or YYYY-MM-DD") from None
    if span is None or span[0] < 0:
        ok = rec.age_years is None and rec.age_range is None
    elif span[0] == span[1]:
        ok = rec.age_years == span[0] and rec.age_range is None
    else:
        ok = rec.age_years is None and rec.age_range == (max(span[0], 0), span[1])
    if not ok:
        raise ValueError(
            "`fhir.age_years` / `fhir.age_range` do not match `fhir.birth_date` at `fhir.reference_date`"
        )


class MatchRequest(_Strict):
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


UNIQUE_PATIENTS = "each patient_id at most once (a pair's results are keyed by it)"


def unique_patient_ids(patients: list[PatientInput] | None) -> list[PatientInput] | None:
    """Refuse a population that names a patient twice, naming the ids (the first ten)."""
    if patients:
        dup = sorted(pid for pid, n in Counter(p.patient_id for p in patients).items() if n > 1)
        if dup:
            raise ValueError(f"duplicate patient_id(s): {', '.join(dup[:10])}")
    return patients


class BatchRequest(_Strict):
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


# ---- audit --------------------------------------------------------------------------------------
class DecisionRecord(BaseModel):
    decision_id: str
    created_at: float
    created_by: str = Field(description="API key id of the caller")
    trial_id: str
    program_hash: str
    patient_id: str
    note_sha256: str
    patient_hash: str
    policy: PolicyRef
    engine_version: str
    decision: str
    models: dict[str, Any]
    timings_ms: dict[str, float]
    artifacts: dict[str, Any] = Field(
        description="decision, resolved patient, value-miner outputs, rationale"
    )
    note_stored: bool
    trial_version: TrialVersion | None = Field(
        None,
        description="artifacts.trial_version: the version decided against (null: recorded before it was)",
    )
    quote_hashing: Literal["keyed", "unkeyed"] | None = Field(
        None,
        description="how the note text this record does not keep is hashed: keyed (HMAC under the "
        "store's secret), unkeyed (plain SHA-256: recorded before keyed hashing, never rewritten; a short "
        "quote can be guessed from it), or null when the note is kept",
    )
    parent_id: str | None = Field(
        None, description="the decision this one supersedes (a review or a re-screening)"
    )
    lineage: dict[str, Any] | None = Field(
        None,
        description="why it superseded its parent: kind (review, rescreen), the changes with reviewer role, "
        "time and reason, program and policy versions; the whole chain: GET /v1/decisions/{id}/history",
    )


# ---- health -------------------------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok"] = "ok"


class EndpointStatus(BaseModel):
    endpoint: str = Field(description="formalizer server (scheme://host:port)")
    state: Literal["unknown", "up", "down"] = Field(
        description="up: lists both adapters; down: skipped until a health check finds it up again"
    )
    reason: str | None = Field(None, description="why it is down (or what it lacks)")
    models: list[str] = Field(default_factory=list, description="models it lists")
    in_flight: int = Field(0, description="requests this replica has in flight towards it")
    failures: int = Field(0, description="failed calls since the replica started")


class Readiness(BaseModel):
    ready: bool
    formalizer: str = Field(description="formalizer servers (scheme://host:port, comma-separated)")
    models: list[str] = Field(default_factory=list, description="models the formalizer server lists")
    missing: list[str] = Field(
        default_factory=list, description="adapters the service needs but the server lacks"
    )
    reason: str | None = None
    endpoints: list[EndpointStatus] = Field(
        default_factory=list, description="each formalizer server: ready when at least one is up"
    )


def base_url_problem(url: str) -> str | None:
    """Why `url` is not a plain http(s) base URL (scheme and host; no credentials, query or fragment),
    or None: a FHIR server's label, the service's own `api.public_url`."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http or https base URL with a host, e.g. https://host.site.example"
    if "@" in parts.netloc or parts.query or parts.fragment:
        return "carries credentials, a query or a fragment"
    return None
