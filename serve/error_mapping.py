"""The one error shape over HTTP: a ServiceError (serve/errors.py), an invalid request or a Starlette
HTTP error each answers an ErrorBody that names fields and never echoes the input; an unexpected
failure becomes a 500 naming an incident id. Also each route's documented error statuses.

The error classes stay in `errors.py` (a light import for the CLI); this module is the HTTP side.
"""

from __future__ import annotations

import logging
import traceback
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .errors import InternalError, ServiceError
from .metrics import ServiceMetrics
from .protocol import ErrorBody, Problem

log = logging.getLogger("verdict.serve")


def error_body(e: ServiceError) -> ErrorBody:
    return ErrorBody(
        error=e.code, message=e.summary, problems=[Problem(field=f, message=m) for f, m in e.field_problems]
    )


def internal_error(e: BaseException) -> ServiceError:
    """An unexpected failure as a 500 naming an incident id; logged as its type and place only
    (exception messages can carry request content)."""
    incident = uuid.uuid4().hex[:12]
    frames = traceback.extract_tb(e.__traceback__)[-6:]
    where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}" for f in reversed(frames))
    log.error("internal error incident=%s type=%s at %s", incident, type(e).__name__, where)
    return InternalError(f"internal error (incident {incident}); see the service log")


_ERROR_TEXT = {
    401: "missing or invalid API key",
    403: "the key lacks the role",
    404: "not found",
    413: "request body too large",
    422: "invalid request: every invalid field is named",
}


def error_responses(texts: dict[int, str]) -> dict:
    """A route's `responses=` for these error statuses (status -> what it means), each an ErrorBody."""
    return {code: {"model": ErrorBody, "description": text} for code, text in texts.items()}


def documented_errors(*, formalizer: bool = False) -> dict:
    """A key-checked route's `responses=` (its OpenAPI error statuses, each an ErrorBody); with
    `formalizer`, also 502 and 503 of a route that calls the students."""
    errors = error_responses(_ERROR_TEXT)
    if formalizer:
        errors |= error_responses(
            {
                502: "formalizer output invalid after one repair",
                503: "formalizer down or slow; see Retry-After",
            }
        )
    return errors


def json_position(doc, loc) -> str:
    """' at line L column C' of a JSON decoder's offset (the last item of `loc`) in `doc`, or ''."""
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    if pos is None or not isinstance(doc, str | bytes):
        return ""
    text = doc if isinstance(doc, str) else doc.decode("utf-8", "replace")
    line = text.count("\n", 0, pos) + 1
    return f" at line {line} column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def install_error_handlers(app: FastAPI, metrics: ServiceMetrics) -> None:
    """ServiceError, invalid requests and Starlette's HTTP errors all answer an ErrorBody that names
    fields and never echoes the input; each is counted in `metrics.errors`."""

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, e: ServiceError):
        metrics.errors.labels(e.code).inc()
        return JSONResponse(error_body(e).model_dump(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, e: RequestValidationError):
        metrics.errors.labels("invalid_request").inc()
        malformed = next((err for err in e.errors() if err.get("type") == "json_invalid"), None)
        if malformed is not None:  # its loc is a decoder offset, not a field: say where, name no field
            where = json_position(getattr(e, "body", None), malformed.get("loc", ()))
            reason = (malformed.get("ctx") or {}).get("error", "not JSON")
            return JSONResponse(
                ErrorBody(
                    error="invalid_request",
                    message=f"malformed JSON{where}",
                    problems=[Problem(field="body", message=f"malformed JSON{where}: {reason}")],
                ).model_dump(),
                status_code=422,
            )
        problems = []
        for err in e.errors():
            loc = list(err.get("loc", ()))
            if loc and loc[0] == "body":
                loc = loc[1:]
            problems.append(
                Problem(field=".".join(str(p) for p in loc) or "body", message=err.get("msg", "invalid"))
            )
        body = ErrorBody(
            error="invalid_request",
            message="invalid request: " + ", ".join(sorted({p.field for p in problems})),
            problems=problems,
        )
        return JSONResponse(body.model_dump(), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, e: StarletteHTTPException):
        if e.status_code == 400:  # a body that is not even text (FastAPI's "error parsing the body")
            metrics.errors.labels("invalid_request").inc()
            return JSONResponse(
                ErrorBody(
                    error="invalid_request",
                    message="invalid request: body",
                    problems=[Problem(field="body", message="not valid UTF-8 JSON")],
                ).model_dump(),
                status_code=422,
            )
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return JSONResponse(
            ErrorBody(error=code, message=str(e.detail)).model_dump(),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )
