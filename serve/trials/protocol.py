"""Request and response models of the trial routes (`POST /v1/trials`, `GET /v1/trials/{id}`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from verdict.core.configs import StrictModel
from verdict.core.program import Id, TrialProgram

from ..contract import any_given, exactly_one, rules
from ..protocol import ID_SCHEMA, MAX_CRITERIA_CHARS, NOT_BLANK, PROGRAM_CHECKS, ProgramObject


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
                ident: _path(nct, leaf=ID_SCHEMA),  # it becomes the trial id
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


class TrialText(StrictModel):
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


class TrialRequest(StrictModel):
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
