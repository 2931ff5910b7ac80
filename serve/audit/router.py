"""`GET /v1/decisions/{id}` (role audit): a decision from the append-only audit store. The logic is
`request.app.state.service.decision_record` (serve/serving.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ..api_keys import KeyEntry
from ..errors import documented_errors
from ..protocol import DecisionRecord
from ..roles import require

router = APIRouter(tags=["audit"])


@router.get("/v1/decisions/{decision_id}", response_model=DecisionRecord, responses=documented_errors())
async def get_decision(
    decision_id: str, request: Request, _key: KeyEntry = Depends(require("audit"))
) -> DecisionRecord:
    """A decision from the append-only audit store (audit role)."""
    return request.app.state.service.decision_record(decision_id)
