"""Request and response models of `POST /v1/decisions/{id}/rereads`.

A re-read names atoms to read in the whole chart (`atoms`), asks to complete the mining staged mining
left incomplete (`complete`), or both, with a reason. The patient record is sent again only when the
audit store keeps no text (`store_notes: false`); it must be the chart the decision was made on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StrictBool, model_validator
from verdict.core.configs import StrictModel

from ..contract import given, rules
from ..protocol import PatientInput
from ..reviews.protocol import MAX_NAME_CHARS, Reason, ReviewResponse

MAX_REREAD_ATOMS = 20  # each atom read in the whole chart is a full pass over it

AtomName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
_COMPLETE = {"required": ["complete"], "properties": {"complete": {"const": True}}}


class RereadRequest(StrictModel):
    model_config = ConfigDict(json_schema_extra=rules({"anyOf": [given("atoms"), _COMPLETE]}))

    atoms: list[AtomName] | None = Field(
        None,
        min_length=1,
        max_length=MAX_REREAD_ATOMS,
        json_schema_extra={"uniqueItems": True},
        description="atoms of the decision's program to read again in the whole chart (every document, "
        "not the read-once fact sheet), each at most once",
    )
    complete: StrictBool = Field(
        False,
        description="also mine the atoms staged mining left unasked ('not asked: the decision was already "
        "settled'), as a match mines them",
    )
    reason: Reason
    patient: PatientInput | None = Field(
        None,
        description="the patient record again, as /v1/match took it: needed when the audit store keeps no "
        "patient text (store_notes: false); it must be the chart the decision was made on (its hash is "
        "checked, 409 otherwise)",
    )

    @model_validator(mode="after")
    def _something_to_read(self):
        if not self.atoms and not self.complete:
            raise ValueError("give `atoms` to read in the whole chart, or `complete: true`, or both")
        if self.atoms and len(set(self.atoms)) != len(self.atoms):
            raise ValueError("`atoms` names an atom more than once")
        return self


class RereadResponse(ReviewResponse):
    read: list[str] = Field(description="the atoms read in the whole chart")
    completed: list[str] = Field(
        description="atoms staged mining had left unasked, mined now (asked with `complete`, or because the "
        "new values let them change the decision)"
    )
    chart: Literal["store", "request"] = Field(
        description="where the chart came from: the audit store's copy, or the record the request sent"
    )
