"""`GET /v1/decisions/{id}` (role audit): a decision from the append-only audit store. The logic is
`decision_record` (serve/audit/serving.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..api_keys import KeyEntry
from ..dependencies import Audit
from ..error_mapping import documented_errors
from ..roles import require
from .protocol import DecisionRecord
from .serving import decision_record

router = APIRouter(tags=["audit"])


@router.get("/v1/decisions/{decision_id}", response_model=DecisionRecord, responses=documented_errors())
async def get_decision(
    decision_id: str, audit: Audit, _key: KeyEntry = Depends(require("audit"))
) -> DecisionRecord:
    """A decision from the append-only audit store (audit role)."""
    return decision_record(audit, decision_id)
