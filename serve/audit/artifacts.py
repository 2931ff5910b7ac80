"""The decision record's artifacts as a type: what each audit row keeps besides its columns.

Two writers build it: `MatchingService._record` (serve/matching/serving.py: a match) and
`reviews.serving.superseding_decision` (a review, a re-read of the chart or a re-screening).
`schema_version` says which shape a row has: rows written before the type existed have none and
load as version 0. Unknown keys are kept as they are (`extra="allow"`): a newer writer may add a
field without breaking older readers, and a row is never rewritten.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from verdict.data_gen.formalizer import ChartRead, PairCost

from ..trial_versions import TrialVersion

ARTIFACTS_SCHEMA = 1


class DecisionArtifacts(BaseModel):
    model_config = ConfigDict(extra="allow")

    schema_version: int = Field(
        0, description="the shape of this row's artifacts; 0: written before it had one"
    )
    decision: dict[str, Any] = Field(description="the core's Decision (verdict.core.decision), by alias")
    patient: dict[str, Any] = Field(description="the resolved patient the core decided on")
    rationale_markdown: str = Field(description="the rendered rationale")
    extraction_conflicts: list[dict[str, Any]] = Field(
        default_factory=list, description="values the documents disagree on (left open)"
    )
    value_miner: dict[str, Any] | None = Field(None, description="per stage: output, attempts, prompt, calls")
    documents: list[dict[str, Any]] | None = Field(None, description="a `notes` record's documents (no text)")
    fhir: dict[str, Any] | None = Field(None, description="a FHIR record's sources (resource ids, no text)")
    arbiter: Any = Field(None, description="the arbiter's verdicts, when it ran")
    verbalizer: Any = Field(None, description="the verbalizer's output, when it ran")
    trial_origin: str | None = Field(None, description="parser, upload or revision")
    trial_version: TrialVersion | None = Field(None, description="the trial version decided against")
    chart_read: ChartRead | None = Field(
        None, description="how the chart was read once for every trial (null: mined whole, or an older row)"
    )
    cost: PairCost | None = Field(
        None,
        description="what the match cost the formalizer (null for a review that read nothing: it calls "
        "no model; a re-read or a completed mining: what its reading cost)",
    )
    reread: list[dict[str, Any]] | None = Field(
        None,
        description="the chart readings a re-derivation made (serve/reviews/reading.py): per reading the "
        "atoms, how the chart was read ('whole', or 'as matched' to complete staged mining), the model and "
        "its value-miner stages; null: nothing was read again",
    )

    @classmethod
    def of(cls, raw: dict[str, Any]) -> DecisionArtifacts:
        """A stored row's artifacts, whichever version wrote them."""
        return cls.model_validate(raw)

    def stored(self) -> dict[str, Any]:
        """As the audit store keeps it (JSON types; the extra keys included)."""
        return self.model_dump(mode="json")


def typed_artifacts(fields: dict[str, Any]) -> dict[str, Any]:
    """What a writer stores: `fields` checked against the type, at the current schema version."""
    return DecisionArtifacts.of({**fields, "schema_version": ARTIFACTS_SCHEMA}).stored()
