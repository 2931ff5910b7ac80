"""HTTP route of re-reads; the logic is in `serving.py` (`RereadService`, through serve/dependencies.py).

POST /v1/decisions/{id}/rereads    review    read atoms in the whole chart / complete staged mining
                                             -> a new decision superseding this one
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..api_keys import KeyEntry
from ..dependencies import Rereads
from ..error_mapping import error_responses
from ..roles import require
from .protocol import RereadRequest, RereadResponse

_ERRORS = error_responses(
    {
        401: "missing or invalid API key",
        403: "the key lacks the role (refused before the body is read)",
        404: "no such decision",
        409: "superseded (a newer decision exists; the message names it), or the record sent is not the "
        "chart the decision was made on (chart_mismatch: the hashes differ)",
        413: "request body too large",
        422: "invalid request, an atom the chart cannot be read for (named, with the closest atom name), "
        "no atom left to complete, the record missing when the store keeps no patient text, or a lineage "
        "at api.reviews.max_reviews_per_lineage",
        502: "the value miner's answer was unusable",
        503: "the formalizer or the audit store is unavailable: nothing was recorded",
    }
)

router = APIRouter(tags=["reviews"])


@router.post("/v1/decisions/{decision_id}/rereads", response_model=RereadResponse, responses=_ERRORS)
async def post_reread(
    decision_id: str, req: RereadRequest, rereads: Rereads, key: KeyEntry = Depends(require("review"))
) -> RereadResponse:
    """Read atoms again in the whole chart (every document, not the read-once fact sheet), and/or
    complete the mining staged mining left incomplete: their values replace the stored ones, the core
    decides again, and a new decision supersedes this one with the lineage (review role)."""
    return await rereads.reread(decision_id, req, key)
