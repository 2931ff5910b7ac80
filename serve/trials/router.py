"""`POST /v1/trials` (role match; an uploaded program needs admin) and `GET /v1/trials/{id}`
(role match or audit). The logic is `TrialService` (serving.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..api_keys import KeyEntry
from ..dependencies import Trials
from ..error_mapping import documented_errors
from ..roles import Forbidden, require
from .protocol import TrialRequest, TrialResponse

router = APIRouter(tags=["trials"])


@router.post("/v1/trials", response_model=TrialResponse, responses=documented_errors(formalizer=True))
async def post_trial(
    req: TrialRequest, trials: Trials, key: KeyEntry = Depends(require("match"))
) -> TrialResponse:
    """Criteria text or a ClinicalTrials.gov study -> the parser student -> a checked trial program,
    cached by content (parsed once). Or upload a reviewed program (admin role), which supersedes
    the parser's for its trial id."""
    if req.program is not None and not key.allows("admin"):
        raise Forbidden("uploading a reviewed program needs the admin role")
    return await trials.register_trial(req, key.id)


@router.get("/v1/trials/{trial_id}", response_model=TrialResponse, responses=documented_errors())
async def get_trial(
    trial_id: str,
    trials: Trials,
    program_hash: str | None = None,
    _key: KeyEntry = Depends(require("match", "audit")),
) -> TrialResponse:
    """The newest program of a trial, or the version `program_hash`."""
    return trials.get_trial(trial_id, program_hash)
