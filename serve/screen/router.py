"""`POST /v1/screen` (role match): the ranked, explained list of one screen."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ..api_keys import KeyEntry
from ..protocol import ErrorBody
from ..roles import require
from .protocol import ScreenRequest, ScreenResponse
from .serving import screen

router = APIRouter(tags=["matching"])


@router.post("/v1/screen", response_model=ScreenResponse,
             responses={code: {"model": ErrorBody} for code in (401, 403, 413, 422)})
async def post_screen(req: ScreenRequest, request: Request, key: KeyEntry = Depends(require("match"))) -> ScreenResponse:
    """One patient against every registered trial (or `trial_ids`), or one trial against `patients`:
    each pair decided and recorded as in /v1/match/batch, then ranked by formal distance (eligible
    with nothing to confirm; eligible with k assumptions to confirm; ineligible with |δ_E| = 1, 2, ...;
    ties by id). A pair that fails is listed in `failures` with its own error; the others are ranked."""
    return await screen(request.app.state.service, req, key.id)
