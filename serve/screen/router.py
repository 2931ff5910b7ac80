"""`POST /v1/screen` (role match): the ranked, explained list of one screen, recorded as a screening
run; `GET /v1/screenings/{id}` (role audit): that record; `GET /v1/screenings/{id}/research-subjects`
(role admin: what `verdict screen --write-back` writes to a FHIR server): its results as FHIR."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends

from ..api_keys import KeyEntry
from ..dependencies import Matching
from ..protocol import ErrorBody
from ..roles import require
from .protocol import ScreeningRecord, ScreeningSubjects, ScreenRequest, ScreenResponse
from .serving import screen, screening_record, screening_subjects

router = APIRouter(tags=["matching"])
# The two reads of a recorded screening refuse alike: no key, the wrong role, no such screening.
_READ_ERRORS = {code: {"model": ErrorBody} for code in (401, 403, 404)}


@router.post(
    "/v1/screen",
    response_model=ScreenResponse,
    responses={code: {"model": ErrorBody} for code in (401, 403, 413, 422)},
)
async def post_screen(
    req: ScreenRequest, matching: Matching, key: KeyEntry = Depends(require("match"))
) -> ScreenResponse:
    """One patient against every registered trial (or `trial_ids`), or one trial against `patients`:
    each pair decided and recorded as in /v1/match/batch, then ranked by formal distance (eligible
    with nothing to confirm; eligible with k assumptions to confirm; ineligible with |δ_E| = 1, 2, ...;
    ties by id). A pair that fails is listed in `failures` with its own error; the others are ranked.
    The run is recorded after its pairs (source, counts, decision ids): `screening_id`."""
    return await screen(matching, req, key.id)


@router.get(
    "/v1/screenings/{screening_id}",
    response_model=ScreeningRecord,
    tags=["audit"],
    responses=_READ_ERRORS,
)
async def get_screening(
    screening_id: str, matching: Matching, _key: KeyEntry = Depends(require("audit"))
) -> ScreeningRecord:
    """A screening run from the append-only audit store: its source as the caller stated it, its
    counts, the decisions it made and the policy (audit role)."""
    return screening_record(matching, screening_id)


@router.get(
    "/v1/screenings/{screening_id}/research-subjects",
    response_model=ScreeningSubjects,
    tags=["audit"],
    responses=_READ_ERRORS,
)
async def get_screening_subjects(
    screening_id: str, matching: Matching, _key: KeyEntry = Depends(require("admin"))
) -> ScreeningSubjects:
    """A screening run's ranked pairs as FHIR R4 ResearchSubjects, built from its recorded decisions
    (admin role only: these are what a write-back puts on the site's FHIR server). Their links start
    with `api.public_url`, or are relative when it is unset (never the request's Host header)."""
    url = matching.config.public_url or ""
    return await asyncio.to_thread(screening_subjects, matching, screening_id, url)
