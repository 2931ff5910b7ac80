"""Request and response models of the review loop (issue 12): reviews of a decision, its history,
trial revisions and flags.

A review is a list of changes, each with a reason; the core re-derives the decision from the stored
resolved patient with the changes applied (no LLM call) and the audit store gets a new decision that
names its parent. Strict models (`extra="forbid"`), bounded texts: a bad change is a 422 naming it
(`changes.3.value`), never a 500.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt
from verdict.core.configs import StrictModel
from verdict.core.patient import PolicyRef

from ..contract import rules
from ..matching.protocol import MatchResponse
from ..protocol import PROGRAM_CHECKS, ProgramObject
from ..trial_versions import TrialVersion
from ..trials.protocol import TrialResponse

MAX_CHANGES = 50
MAX_REASON_CHARS = 2000
MAX_EVIDENCE_CHARS = 2000
MAX_NOTE_CHARS = 4000
MAX_NAME_CHARS = 200
# A value as JSON gives it, or as text (an HTML form sends "true", "1.4" or "1.4 mg/dL"): checked
# against the atom's domain and unit at review time.
ReviewValue = StrictBool | StrictInt | StrictFloat | Annotated[str, Field(min_length=1, max_length=100)]
Reason = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_REASON_CHARS,
        pattern=r"\S",
        description="why: required, kept in the history",
    ),
]
Established = Literal["screening_visit", "chart"]


# ---- changes ------------------------------------------------------------------------------------
class ConfirmChange(StrictModel):
    """Confirm an assumption (an imputed value) or an open atom: the value as established."""

    type: Literal["confirm"] = Field(description="confirm an assumption or an open atom")
    atom: str = Field(
        min_length=1, max_length=MAX_NAME_CHARS, description="an atom of the decision's program"
    )
    value: ReviewValue = Field(
        description="the value established (checked against the atom's domain and unit)"
    )
    established: Established = Field(description="where the value was established")
    evidence: str = Field(
        "", max_length=MAX_EVIDENCE_CHARS, description="optional evidence text (e.g. a quote)"
    )
    reason: Reason


class CorrectChange(StrictModel):
    """Correct an extracted fact: a new value, or null meaning "unknown" (the policy then applies)."""

    type: Literal["correct"] = Field(description="correct an extracted fact")
    atom: str = Field(
        min_length=1, max_length=MAX_NAME_CHARS, description="an atom of the decision's program"
    )
    value: ReviewValue | None = Field(description="the right value, or null: unknown (left to the policy)")
    evidence: str = Field(
        "", max_length=MAX_EVIDENCE_CHARS, description="optional evidence text for the value"
    )
    reason: Reason = Field(description="why the old value was wrong")


class FlagChange(StrictModel):
    """Flag a trial criterion as mis-formalized: a note for the trial's owner; the decision stays."""

    type: Literal["flag"] = Field(
        description="flag a criterion as mis-formalized (does not change the decision)"
    )
    criterion: str = Field(
        min_length=1, max_length=MAX_NAME_CHARS, description="a criterion id of the program"
    )
    note: str = Field(
        min_length=1, max_length=MAX_NOTE_CHARS, description="what is wrong, for the trial's owner"
    )
    reason: Reason


Change = Annotated[ConfirmChange | CorrectChange | FlagChange, Field(discriminator="type")]


class ReviewRequest(StrictModel):
    changes: list[Change] = Field(min_length=1, max_length=MAX_CHANGES, description="applied in order")


# ---- what the store records -----------------------------------------------------------------------
class RecordedChange(BaseModel):
    """One change as the lineage records it (a review's change, a re-screening, or a reading of the
    chart: an atom re-read in the whole chart, or the mining of atoms not asked completed)."""

    type: Literal["confirm", "correct", "flag", "rescreen", "feedback", "reread", "complete"]
    atom: str | None = Field(None, description="confirm / correct: the atom")
    criterion: str | None = Field(
        None, description="flag: the criterion id; null: the decision as a whole (an override in the EHR)"
    )
    value: StrictBool | StrictInt | StrictFloat | None = Field(
        None, description="the value set (typed); null: unknown (reread: nothing found, or bounds only)"
    )
    established: str | None = Field(
        None, description="confirm: screening_visit or chart; correct: reviewer; reread: chart"
    )
    evidence: str | None = Field(None, description="the reviewer's evidence text, if any")
    note: str | None = Field(None, description="flag: the note for the trial's owner")
    previous: dict[str, Any] | None = Field(
        None, description="the atom's resolution before the change: status, value, bounds (no quote)"
    )
    reason: str = Field(description="why")
    reviewer: str = Field(description="API key id of the reviewer (or of whoever ran the re-screening)")
    roles: list[str] = Field(description="the key's roles")
    at: float = Field(description="unix time of the change")
    details: dict[str, Any] | None = Field(
        None,
        description="rescreen: what triggered it (policy, program); feedback: the EHR's outcome on the "
        "CDS Hooks card (outcome, card, service, override reason); reread: the atom's new status and "
        "the document its value came from; complete: the atoms mined and those found",
    )


class Lineage(BaseModel):
    """What a superseding decision records about how it came about."""

    kind: Literal["review", "rescreen", "reread"]
    parent_id: str = Field(description="the decision it supersedes")
    changes: list[RecordedChange]


class HistoryEntry(BaseModel):
    decision_id: str
    parent_id: str | None = Field(description="the decision this one superseded; null for the first")
    kind: Literal["match", "review", "rescreen", "reread"] = Field(description="how the decision came about")
    created_at: float
    created_by: str = Field(description="API key id")
    program_hash: str = Field(description="the program version decided against")
    policy: PolicyRef = Field(description="the policy and its version")
    decision: str = Field(description="eligible / ineligible / undetermined")
    changes: list[RecordedChange] = Field(default_factory=list, description="what changed from the parent")
    trial_version: TrialVersion | None = Field(
        None, description="the trial version decided against; null: recorded before it was"
    )


class DecisionHistory(BaseModel):
    decision_id: str = Field(description="the decision asked for")
    current_id: str = Field(
        description="the newest decision of its lineage (== decision_id when not superseded)"
    )
    superseded: bool = Field(description="whether a newer decision supersedes the one asked for")
    total: int = Field(description="entries in the lineage from the first decision to the one asked for")
    offset: int = Field(
        description="the position of the first entry of this page in the lineage (0: the first)"
    )
    entries: list[HistoryEntry] = Field(
        description="one page of the lineage from the first decision to the one asked for, oldest first"
    )
    next_cursor: str | None = Field(
        None, description="pass as `cursor` for the next page (newer entries); null on the last page"
    )


class ReviewLinks(BaseModel):
    decision: str
    page: str
    history: str


class ReviewResponse(BaseModel):
    decision_id: str = Field(description="the new decision")
    parent_id: str = Field(description="the decision it supersedes")
    previous_decision: str = Field(description="the parent's decision label")
    changed: bool = Field(description="whether the decision label changed")
    result: MatchResponse = Field(description="the re-derived decision, as /v1/match returns it")
    changes: list[RecordedChange]
    links: ReviewLinks


# ---- trial revisions and flags --------------------------------------------------------------------
class RevisionRequest(StrictModel):
    """A corrected program for a trial (admin or trial_owner): checked, then the active version."""

    model_config = ConfigDict(json_schema_extra=rules(also_checked=PROGRAM_CHECKS))

    # A plain object, checked by the core's TrialProgram model (422s name `program.<path>`), as in
    # POST /v1/trials; the document states the TrialProgram schema.
    program: ProgramObject = Field(description="the corrected program, format verdict.trial_program/v1")
    reason: Reason = Field(description="what the revision corrects")
    revises: str | None = Field(
        None,
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="the version it corrects (default: the active one); 409 when it is no longer active",
    )


class RevisionResponse(BaseModel):
    trial: TrialResponse = Field(description="the new version (origin 'revision', active)")
    revises: str | None = Field(description="program_hash of the version it corrects")
    reason: str
    unchanged: bool = Field(
        False, description="true when the program equals the active version (nothing stored)"
    )


class FlagEntry(BaseModel):
    decision_id: str = Field(description="the decision the flag was raised on (the review's new decision)")
    program_hash: str
    criterion: str | None = Field(
        description="the criterion flagged; null: the decision as a whole (a card overridden in the EHR)"
    )
    note: str
    reason: str
    reviewer: str = Field(description="API key id")
    roles: list[str]
    at: float


class TrialFlags(BaseModel):
    trial_id: str
    flags: list[FlagEntry] = Field(
        description="newest first; one page: at least `limit` flags unless none are left (a review's "
        "flags are never split across pages)"
    )
    next_cursor: str | None = Field(
        None, description="pass as `cursor` for the next (older) page; null when no older review is left"
    )
