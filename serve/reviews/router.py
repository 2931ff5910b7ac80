"""HTTP routes of the review loop; the logic is in `serving.py` (`ReviewService`, through
serve/dependencies.py).

POST /v1/decisions/{id}/reviews    review            confirm / correct / flag -> a new decision
GET  /v1/decisions/{id}/history    audit or review   the chain from the first decision to this one (paged)
POST /v1/trials/{id}/revisions     trial_owner/admin a corrected program -> the active version
GET  /v1/trials/{id}/flags         trial_owner, audit or review   criteria flagged by reviewers (paged)

The store reads and the rendering run in a worker thread: a long lineage never holds the event loop.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Query

from ..api_keys import KeyEntry
from ..dependencies import Reviews
from ..error_mapping import error_responses
from ..roles import require
from .protocol import (
    DecisionHistory,
    ReviewRequest,
    ReviewResponse,
    RevisionRequest,
    RevisionResponse,
    TrialFlags,
)

_ERRORS = error_responses(
    {
        401: "missing or invalid API key",
        403: "the key lacks the role",
        404: "no such decision or trial",
        409: "superseded: a newer decision (or trial version) exists; the message names it",
        413: "request body too large, or a review's text over api.reviews.max_review_chars",
        422: "invalid request: every invalid field is named (changes.N.atom, changes.N.value, program...); "
        "a lineage at api.reviews.max_reviews_per_lineage",
        503: "the audit store is unavailable: nothing was recorded",
    }
)

router = APIRouter(tags=["reviews"])


@router.post("/v1/decisions/{decision_id}/reviews", response_model=ReviewResponse, responses=_ERRORS)
async def post_review(
    decision_id: str, req: ReviewRequest, reviews: Reviews, key: KeyEntry = Depends(require("review"))
) -> ReviewResponse:
    """Confirm assumptions or open atoms, correct extracted facts, flag criteria: the core re-derives
    the decision (no language-model call) and a new decision supersedes this one (review role)."""
    return await reviews.review(decision_id, req, key)


Cursor = Query(None, max_length=200, description="`next_cursor` of the previous page")
Limit = Query(None, ge=1, le=500, description="entries per page (default api.reviews.history_page)")


@router.get("/v1/decisions/{decision_id}/history", response_model=DecisionHistory, responses=_ERRORS)
async def get_history(
    decision_id: str,
    reviews: Reviews,
    _key: KeyEntry = Depends(require("audit", "review")),
    cursor: str | None = Cursor,
    limit: int | None = Limit,
) -> DecisionHistory:
    """The decision's lineage: from the first decision to this one, with each change's reviewer,
    time and reason (audit or review role). One page, oldest first: follow `next_cursor`."""
    return await asyncio.to_thread(reviews.history, decision_id, cursor, limit)


@router.post("/v1/trials/{trial_id}/revisions", response_model=RevisionResponse, responses=_ERRORS)
async def post_revision(
    trial_id: str, req: RevisionRequest, reviews: Reviews, key: KeyEntry = Depends(require("trial_owner"))
) -> RevisionResponse:
    """A corrected program for the trial: checked like an upload, stored as a new version (origin
    `revision`) that becomes active; the old version stays readable by hash (trial_owner or admin)."""
    return await reviews.revise(trial_id, req, key)


@router.get("/v1/trials/{trial_id}/flags", response_model=TrialFlags, responses=_ERRORS)
async def get_flags(
    trial_id: str,
    reviews: Reviews,
    _key: KeyEntry = Depends(require("trial_owner", "audit", "review")),
    cursor: str | None = Cursor,
    limit: int | None = Limit,
) -> TrialFlags:
    """Criteria reviewers flagged as mis-formalized, newest first (trial_owner, audit or review).
    One page: follow `next_cursor`."""
    return await asyncio.to_thread(reviews.flags, trial_id, cursor, limit)
