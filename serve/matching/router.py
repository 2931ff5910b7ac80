"""`POST /v1/match` (one trial, one patient) and `POST /v1/match/batch` (NDJSON, every patient
against every trial), role match. The logic is `MatchingService` (serving.py; the batch's stream:
serve/pairs.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from ..api_keys import KeyEntry
from ..contract import NDJSON
from ..dependencies import Matching
from ..error_mapping import documented_errors, error_responses
from ..pairs import match_batch as batch_lines
from ..roles import require
from ..trial_versions import inactive_use_for
from .protocol import BatchLine, BatchRequest, MatchRequest, MatchResponse

router = APIRouter(tags=["matching"])


_INACTIVE = error_responses(
    {
        409: "inactive_version: program_hash pins a version that is not the trial's active one "
        "(only a trial_owner key may match against it, as a preview); the message names the active version",
    }
)


@router.post(
    "/v1/match", response_model=MatchResponse, responses={**documented_errors(formalizer=True), **_INACTIVE}
)
async def match(
    req: MatchRequest, matching: Matching, key: KeyEntry = Depends(require("match"))
) -> MatchResponse:
    """A trial and a patient note -> value miner (inclusion and exclusion passes) -> policy -> core:
    the full Decision, the resolved patient with evidence, and the rationale. Recorded for audit.
    `program_hash` pinning a version that is not the trial's active one: a preview for a trial_owner
    (or admin) key, marked as such in `trial_version`; 409 `inactive_version` for any other key."""
    return await matching.match(req, key.id, inactive_use_for(key))


class NDJSONResponse(StreamingResponse):
    """A stream of JSON lines: the media type the document names for the route's 200 schema."""

    media_type = NDJSON


@router.post(
    "/v1/match/batch",
    response_class=NDJSONResponse,
    # `model` puts BatchLine (and what it uses) under components/schemas, referenced from the stream
    responses={
        **documented_errors(),
        200: {
            "model": BatchLine,
            "description": "NDJSON stream of BatchLine objects (one per line), in completion order",
        },
    },
)
async def match_batch(req: BatchRequest, matching: Matching, key: KeyEntry = Depends(require("match"))):
    """Every patient against every trial; one JSON line per pair as it finishes."""
    lines = batch_lines(matching, req, key.id)
    first = await anext(lines, None)  # validation errors surface as a status, before streaming

    async def stream():
        if first is not None:
            yield first.model_dump_json(by_alias=True) + "\n"
            async for line in lines:
                yield line.model_dump_json(by_alias=True) + "\n"

    return NDJSONResponse(stream())
