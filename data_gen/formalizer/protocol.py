"""Typed models at the boundaries of the teacher pipeline: inputs (trials, patients, pairs), what a
formalizer stage returns, and the output formats of the arbiter and verbalizer stages.

The parser and value-miner output formats are the core's (`ParsedTrial`, `ValueMinerOutput`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator
from verdict.core.configs import StrictModel
from verdict.core.formula import AtomName
from verdict.core.patient import Value

# A section's own heading ("Inclusion Criteria:", or a bare ":" left by upstream splitting).
_HEADING = re.compile(r"^\s*(?:(?:inclusion|exclusion)\s+criteria\s*:?|:)", re.IGNORECASE)


# ---- inputs ---------------------------------------------------------------------------------------
class TrialDoc(StrictModel):
    """Public eligibility criteria of one trial."""

    trial_id: str
    title: str = ""
    inclusion: str | None = None
    exclusion: str | None = None
    criteria: str = Field("", description="raw criteria text (used when inclusion/exclusion are not split)")
    source: str = ""

    def criteria_text(self) -> str:
        """The criteria as the parser prompt shows them: two headed sections where split."""
        if self.inclusion or self.exclusion:
            inc = _HEADING.sub("", self.inclusion or "", count=1).strip() or "(none)"
            exc = _HEADING.sub("", self.exclusion or "", count=1).strip() or "(none)"
            return f"Inclusion criteria:\n{inc}\n\nExclusion criteria:\n{exc}"
        return self.criteria.strip()


class NoteDocument(StrictModel):
    """One document of a patient record (a discharge summary, a lab report, ...)."""

    id: str = Field(min_length=1, description="the document's id; every evidence quote names it")
    text: str = Field(min_length=1)
    date: str | None = Field(None, description="when the document was written (ISO date), if known")
    kind: str | None = Field(None, description="e.g. discharge_summary, radiology, lab")


SINGLE_NOTE_ID = "note"  # the document id of a patient given as one text


class PatientDoc(StrictModel):
    """A patient note, or several documents. Its text never goes to logs; log `patient_id` or
    `text_hash` instead. Given `documents` only, `text` is their texts joined by blank lines."""

    patient_id: str
    text: str = ""
    documents: list[NoteDocument] | None = Field(
        None, description="several documents (default: `text` as one)"
    )
    data_class: Literal["private", "public", "synthetic"] = "private"
    fhir: dict | None = Field(
        None,
        description="the FHIR patient record (verdict.fhir_patient/v1, as `verdict fhir "
        "load --out` writes it) the documents come from: its coded facts decide atoms "
        "without the miner",
    )

    @model_validator(mode="after")
    def _text_or_documents(self):
        if self.documents:
            ids = [d.id for d in self.documents]
            if len(set(ids)) != len(ids):
                raise ValueError("document ids must be unique")
            if not self.text:
                self.text = "\n\n".join(d.text for d in self.documents)
        elif not self.text:
            raise ValueError("give `text` or `documents`")
        return self

    def note_documents(self) -> list[NoteDocument]:
        """The record as documents: `documents`, or `text` as the one document 'note'."""
        return list(self.documents) if self.documents else [NoteDocument(id=SINGLE_NOTE_ID, text=self.text)]

    @property
    def text_hash(self) -> str:
        import hashlib

        return hashlib.sha256(self.text.encode()).hexdigest()[:12]


class Pair(StrictModel):
    patient_id: str
    trial_id: str
    score: int | None = None


# ---- stage results --------------------------------------------------------------------------------
class Usage(StrictModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = Field(0.0, description="what the calls behind the result cost when they were paid")
    paid_usd: float = Field(0.0, description="what this invocation paid (cache hits are free)")
    calls_paid: int = 0
    cache_hits: int = 0
    # Tokens of the calls actually sent to a model (cache hits excluded): what a site's GPU spent.
    paid_prompt_tokens: int = 0
    paid_completion_tokens: int = 0

    def add(self, other: Usage) -> Usage:
        return Usage(**{k: getattr(self, k) + getattr(other, k) for k in Usage.model_fields})

    @classmethod
    def total(cls, usages: Iterable[Usage]) -> Usage:
        """The sum of these usages, in order."""
        out = cls()
        for u in usages:
            out = out.add(u)
        return out


class Attempt(StrictModel):
    """One model output and what validation said about it (first try, then the repair)."""

    key: str = Field(description="cache key of the call")
    cached: bool
    finish_reason: str | None = None
    problems: list[str] = Field(default_factory=list)
    reason: str | None = Field(None, description="rejection category of this attempt, if it failed")


Status = Literal["accepted", "rejected"]


class DroppedDocument(StrictModel):
    """A document of the chart not read, and why (ids only, never text)."""

    id: str
    why: Literal["selection", "duplicate", "empty"]
    detail: str


class TrimmedDocument(StrictModel):
    """A document read without some of its paragraphs: copies of text that later documents keep."""

    id: str
    paragraphs_removed: int
    kept_in: list[str] = Field(description="the documents that keep the removed paragraphs")


class ChartRead(StrictModel):
    """How a patient's chart was read once for every trial (issue 23; ids and counts, no text): the
    reductions, the reading, and its one-time cost. `reused`: this caller got the reading another
    trial (or the other side) had made or was making, so its cost is not this pair's."""

    documents: int = Field(description="documents in the chart")
    mined_whole: bool = Field(
        False, description="no reading: the reduced chart was small enough to be mined whole"
    )
    dropped: list[DroppedDocument] = Field(default_factory=list)
    trimmed: list[TrimmedDocument] = Field(default_factory=list)
    passages_read: int = 0
    excerpts_kept: int = 0
    excerpts_repeated: int = Field(
        0, description="excerpts left out because a later document states the same text (kept there)"
    )
    sheet_documents: list[str] = Field(default_factory=list, description="documents with kept excerpts")
    kept_whole: list[str] = Field(
        default_factory=list,
        description="passage groups whose reading failed validation: put on the sheet whole (nothing lost)",
    )
    calls: int = Field(0, description="reader calls the reading sent to a model (a repair is a call)")
    cache_hits: int = Field(0, description="reader calls answered from the call cache (no model work)")
    prompt_tokens: int = Field(0, description="prompt tokens of the reader calls sent")
    completion_tokens: int = Field(0, description="completion tokens of the reader calls sent")
    reused: bool = False
    routed: bool = Field(
        False,
        description="the fact sheet was larger than a value-miner call reads: each atom chunk read the "
        "excerpts routed to its atoms (formalizer/routing.py)",
    )
    evidence_documents: list[str] = Field(
        default_factory=list, description="the documents the decision's evidence quotes come from"
    )

    def summary(self) -> str:
        """One line for a clinician: what was read, what was dropped and why, where the evidence is."""
        out = (
            f"mined whole: {self.documents} documents"
            if self.mined_whole
            else f"read once: {self.documents} documents -> {self.excerpts_kept} passages kept"
        )
        if self.dropped:
            out += "; not read: " + ", ".join(f"{d.id} ({d.why}: {d.detail})" for d in self.dropped)
        if self.trimmed:
            out += "; copied-forward text read in the later document: " + ", ".join(
                f"{t.id} -> {', '.join(t.kept_in)}" for t in self.trimmed
            )
        if self.kept_whole:
            out += f"; {len(self.kept_whole)} passage group(s) kept whole (the reading failed its check)"
        if self.routed:
            out += "; each atom read the passages that bear on it"
        if self.evidence_documents:
            out += "; evidence from " + ", ".join(self.evidence_documents)
        return out


class StageResult(StrictModel):
    """What one formalizer stage produced: an accepted, checked output or a rejection with its reason.

    `messages` is the prompt (system + user) of the first attempt; `output_json` the compact JSON
    a student must emit for it (accepted only). `output` is the typed object: a `TrialProgram`
    (parser), a list of `MinedValue` (miners), a list of `Override` (arbiter) or the rationale text.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    stage: str
    status: Status
    reason: str | None = Field(
        None,
        description="rejection category: json, truncated, schema, program, "
        "undeclared_atom, unsatisfiable, evidence, coverage, decision, ...",
    )
    problems: list[str] = Field(default_factory=list)
    teacher: str
    model: str
    prompt_version: str
    messages: list[dict[str, str]]
    output_json: str | None = None
    output: Any = None
    attempts: list[Attempt] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    item: str | None = Field(
        None,
        description="which part of the stage's input one call covers (a criterion "
        "id, a miner chunk); None for a whole-input result",
    )
    calls: list[StageResult] = Field(
        default_factory=list,
        description="a stage made of several calls "
        "(per criterion, per chunk): one result per call, each with its "
        "`item`; `usage` is then their sum",
    )
    chart_read: ChartRead | None = Field(
        None, description="value miner on a chart read once (issue 23): the reading behind this result"
    )
    assembly: dict[str, Any] | None = Field(
        None,
        description="what combining the calls did: merges, "
        "near-duplicates, failed or out-of-scope parts (ids, no patient text)",
    )

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    @property
    def repaired(self) -> bool:
        return self.accepted and len(self.attempts) > 1


# ---- arbiter and verbalizer output formats --------------------------------------------------------
class ArbiterOverride(StrictModel):
    atom: AtomName
    value: Value | None = Field(description="the value the chart supports; null = leave it open")
    evidence: str = Field("", description="verbatim quote from the note supporting the value")
    reason: str = Field(min_length=1)


class ArbiterOutput(StrictModel):
    overrides: list[ArbiterOverride] = Field(
        description="minimal changes; empty if no faithful correction exists"
    )


class VerbalizerOutput(StrictModel):
    decision: Literal["eligible", "ineligible", "undetermined"]
    rationale: str = Field(min_length=1)
