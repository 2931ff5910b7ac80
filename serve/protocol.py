"""Request and response models of the matching API (the OpenAPI schema is generated from these).

Strict (`extra="forbid"`), with limits on every text field, so that a malformed request is a 422
naming each invalid field, never a 500. Patient text comes in `PatientInput.note`, `.notes` or
`.fhir` (its documents) only. The rules the models check across fields are in the schema too
(`serve/contract.py`), so that a request valid by the document is one the service accepts.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from typing import Annotated, Any
from urllib.parse import urlsplit

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
from verdict.core.program import Id, TrialProgram
from verdict.data_gen.fhir.models import FhirPatientRecord
from verdict.data_gen.fhir.records import age_at
from verdict.data_gen.fhir.resolve import default_code_map
from verdict.data_gen.formalizer import SINGLE_NOTE_ID, NoteDocument

from .contract import all_of, exactly_one, given, only_with, outline, rules

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


ID_SCHEMA = TypeAdapter(Id).json_schema()
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


# ---- the patient (matching, batches, screening) ----------------------------------------------
class NoteInput(StrictModel):
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
            "patient_id": ID_SCHEMA,
            "reference_date": {"type": "string", "pattern": ISO_DATE},
            "birth_date": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": BIRTH_DATE}]},
            "documents": {
                "minItems": 1,
                "maxItems": MAX_NOTES,
                "items": {
                    "properties": {
                        "id": ID_SCHEMA,
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


class PatientInput(StrictModel):
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


UNIQUE_PATIENTS = "each patient_id at most once (a pair's results are keyed by it)"


def unique_patient_ids(patients: list[PatientInput] | None) -> list[PatientInput] | None:
    """Refuse a population that names a patient twice, naming the ids (the first ten)."""
    if patients:
        dup = sorted(pid for pid, n in Counter(p.patient_id for p in patients).items() if n > 1)
        if dup:
            raise ValueError(f"duplicate patient_id(s): {', '.join(dup[:10])}")
    return patients


def base_url_problem(url: str) -> str | None:
    """Why `url` is not a plain http(s) base URL (scheme and host; no credentials, query or fragment),
    or None: a FHIR server's label, the service's own `api.public_url`."""

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http or https base URL with a host, e.g. https://host.site.example"
    if "@" in parts.netloc or parts.query or parts.fragment:
        return "carries credentials, a query or a fragment"
    return None


def checked_base_url(url: str | None, name: str) -> str | None:
    """A field validator's check: `url` without its trailing slash (None stays None), or ValueError
    naming `name` when it is not a plain base URL (`base_url_problem`)."""
    problem = base_url_problem(url) if url is not None else None
    if problem:
        raise ValueError(f"{name} {problem}")
    return url.rstrip("/") if url is not None else None
