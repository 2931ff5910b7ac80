"""Models of the CDS Hooks 2.0 service (https://cds-hooks.hl7.org/2.0/): discovery, the
`patient-view` hook call and its cards, and feedback. Field names are the specification's
(camelCase). Requests are strict where this service reads them (a hook it does not offer, a
`fhirAuthorization` without `fhirServer`, a card id that is no UUID: a 422 naming the field), and
keep the specification's optional members (`extension`, `encounterId`, ...) without reading them."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..contract import given, only_with, rules
from ..protocol import checked_base_url

HOOK = "patient-view"
PATIENT_ID = r"^[A-Za-z0-9][A-Za-z0-9\-.]{0,63}$"  # a FHIR logical id (and a decision's patient id)
MAX_COMMENT_CHARS = 2000
OVERRIDE_SYSTEM = "urn:verdict:cds-hooks:override-reason"
TIER_SYSTEM = "urn:verdict:cds-hooks:tier"


class _Spec(BaseModel):
    """A CDS Hooks object as a request carries it: the members this service reads, checked; an
    `extension` kept; anything else refused, named."""

    model_config = ConfigDict(extra="forbid")


# ---- discovery ------------------------------------------------------------------------------------
class CdsService(BaseModel):
    hook: str = Field(description="the hook this service answers: patient-view")
    id: str = Field(description="POST /cds-services/{id}")
    title: str
    description: str
    prefetch: dict[str, str] = Field(description="FHIR queries the EHR may send along (prefetch templates)")
    usageRequirements: str | None = None


class CdsServices(BaseModel):
    services: list[CdsService]


# ---- the hook call --------------------------------------------------------------------------------
class FhirAuthorization(_Spec):
    access_token: str = Field(min_length=1, max_length=8192, description="bearer token for fhirServer")
    token_type: Literal["Bearer"]
    expires_in: int = Field(gt=0, description="seconds the token stays valid")
    scope: str = Field(max_length=4000)
    subject: str = Field(max_length=500, description="this service's OAuth client id at the EHR")
    patient: str | None = Field(None, max_length=64)


class PatientViewContext(_Spec):
    userId: str | None = Field(None, max_length=200, description="e.g. Practitioner/123 (not read)")
    patientId: str = Field(pattern=PATIENT_ID, description="the FHIR id of the patient in view")
    encounterId: str | None = Field(None, max_length=200)


class HookRequest(_Spec):
    """A `patient-view` call. Cards come from decisions already made; when a registered trial has no
    current decision for the patient, a screening is queued from `prefetch` or from `fhirServer`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra=rules(
            only_with("fhirAuthorization", "fhirServer"),
            {"anyOf": [given("fhirServer"), given("prefetch")]},
        ),
    )

    hook: Literal["patient-view"] = Field(description="patient-view (the only hook this service offers)")
    hookInstance: str = Field(min_length=1, max_length=100, description="a UUID of this call")
    fhirServer: str | None = Field(None, description="the EHR's FHIR base URL (on the egress allowlist)")
    fhirAuthorization: FhirAuthorization | None = None
    context: PatientViewContext
    prefetch: dict[str, dict[str, Any] | None] | None = Field(
        None, description="resources the EHR read ahead (keys of the discovery's prefetch templates)"
    )
    extension: dict[str, Any] | None = None

    @field_validator("fhirServer")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return checked_base_url(v, "fhirServer")

    @model_validator(mode="after")
    def _a_source(self):
        if self.fhirAuthorization is not None and self.fhirServer is None:
            raise ValueError("fhirAuthorization needs fhirServer")
        if self.fhirServer is None and self.prefetch is None:
            raise ValueError(
                "give fhirServer (with fhirAuthorization) or prefetch: the patient's data source"
            )
        return self


class Coding(BaseModel):
    code: str = Field(min_length=1, max_length=200)
    system: str | None = Field(None, max_length=500)
    display: str | None = Field(None, max_length=500)


class Source(BaseModel):
    label: str
    url: str | None = None
    topic: Coding | None = None


class Link(BaseModel):
    label: str
    url: str = Field(description="the service's sign-in, then the decision's page")
    type: Literal["absolute"] = "absolute"


class Card(BaseModel):
    uuid: str = Field(description="the decision's id as a UUID: feedback on the card reaches the decision")
    summary: str = Field(max_length=140)
    detail: str | None = Field(None, description="GitHub-flavoured Markdown")
    indicator: Literal["info", "warning", "critical"]
    source: Source
    overrideReasons: list[Coding] = Field(default_factory=list)
    links: list[Link] = Field(default_factory=list)


class CdsResponse(BaseModel):
    cards: list[Card] = Field(
        description="best first, as a screen ranks them; empty when nothing is known yet"
    )


# ---- feedback -------------------------------------------------------------------------------------
class OverrideReason(_Spec):
    reason: Coding | None = Field(None, description="one of the card's overrideReasons")
    userComment: str | None = Field(None, min_length=1, max_length=MAX_COMMENT_CHARS)


class FeedbackItem(_Spec):
    card: str = Field(description="the card's uuid")
    outcome: Literal["accepted", "overridden"]
    acceptedSuggestions: list[dict[str, Any]] | None = Field(None, max_length=20)
    overrideReason: OverrideReason | None = None
    outcomeTimestamp: str = Field(min_length=1, max_length=40, description="ISO 8601 date-time")

    @field_validator("card")
    @classmethod
    def _a_uuid(cls, v: str) -> str:
        try:
            return str(uuid.UUID(v))
        except ValueError:
            raise ValueError("not a card uuid this service gave") from None

    @model_validator(mode="after")
    def _reason_when_overridden(self):
        if self.overrideReason is not None and self.outcome != "overridden":
            raise ValueError("overrideReason goes with outcome 'overridden'")
        return self

    @property
    def decision_id(self) -> str:
        return "dec_" + uuid.UUID(self.card).hex


class FeedbackRequest(_Spec):
    feedback: list[FeedbackItem] = Field(min_length=1, max_length=50)


class FeedbackRecorded(BaseModel):
    card: str
    decision_id: str = Field(description="the new decision that records the feedback in its lineage")
    flagged: bool = Field(description="an override with a reason: a flag on the decision for its reviewers")


class FeedbackResponse(BaseModel):
    recorded: list[FeedbackRecorded]


def card_uuid(decision_id: str) -> str:
    """A decision id (`dec_` + 32 hex digits) as a card's UUID, and back by `FeedbackItem.decision_id`."""
    return str(uuid.UUID(hex=decision_id.removeprefix("dec_")))
