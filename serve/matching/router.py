"""`POST /v1/match` (one trial, one patient) and `POST /v1/match/batch` (NDJSON, every patient
against every trial), role match. The logic is `request.app.state.service` (serve/serving.py; the
batch's stream: serve/pairs.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from ..api_keys import KeyEntry
from ..errors import documented_errors
from ..pairs import match_batch as batch_lines
from ..protocol import BatchLine, BatchRequest, MatchRequest, MatchResponse
from ..roles import require

router = APIRouter(tags=["matching"])


@router.post("/v1/match", response_model=MatchResponse, responses=documented_errors(formalizer=True))
async def match(
    req: MatchRequest, request: Request, key: KeyEntry = Depends(require("match"))
) -> MatchResponse:
    """A trial and a patient note -> value miner (inclusion and exclusion passes) -> policy -> core:
    the full Decision, the resolved patient with evidence, and the rationale. Recorded for audit."""
    return await request.app.state.service.match(req, key.id)


@router.post(
    "/v1/match/batch",
    response_class=StreamingResponse,
    responses={
        **documented_errors(),
        200: {
            "description": "NDJSON stream of BatchLine objects, in completion order",
            "content": {"application/x-ndjson": {"schema": BatchLine.model_json_schema()}},
        },
    },
)
async def match_batch(req: BatchRequest, request: Request, key: KeyEntry = Depends(require("match"))):
    """Every patient against every trial; one JSON line per pair as it finishes."""
    lines = batch_lines(request.app.state.service, req, key.id)
    first = await anext(lines, None)  # validation errors surface as a status, before streaming

    async def stream():
        if first is not None:
            yield first.model_dump_json(by_alias=True) + "\n"
            async for line in lines:
                yield line.model_dump_json(by_alias=True) + "\n"

    return StreamingResponse(stream(), media_type="application/x-ndjson")
