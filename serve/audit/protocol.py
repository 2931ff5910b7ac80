"""The audit view of one decision (`GET /v1/decisions/{id}`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field
from verdict.core.patient import PolicyRef

from ..trial_versions import TrialVersion


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
