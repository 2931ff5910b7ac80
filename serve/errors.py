"""Errors of the serving part. All are VerdictErrors: the CLI prints `error: <message>`, exit 2.

Messages never quote patient text: they name fields, ids and hashes only. Over HTTP,
`install_error_handlers` answers them (and FastAPI's own errors) in the one ErrorBody shape.
"""

from __future__ import annotations

from verdict.core.errors import VerdictError


class ServeConfigError(VerdictError):
    """A serve config (configs/serve/NAME.yaml), an adapter folder or an API key file is unusable."""


class VLLMServerError(VerdictError):
    """The vLLM server could not be started, died, or did not become ready in time."""


class AdapterCheckError(VerdictError):
    """The golden set could not be run (not: the adapter disagreed; that is a report)."""


class BatchError(VerdictError):
    """A batch-matching input or shard is unusable."""


class ServiceError(VerdictError):
    """A request the matching service answers with an error status (never a 500)."""

    status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str,
        problems: list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.field_problems = problems or []  # (field, message)
        self.headers = headers or {}
        super().__init__(message, [f"{f}: {m}" for f, m in self.field_problems])


class NotFound(ServiceError):
    status, code = 404, "not_found"


class InvalidInput(ServiceError):
    status, code = 422, "invalid_request"


class FormalizerUnavailable(ServiceError):
    """Down, refusing, or slower than the configured timeout: try again later (503 + Retry-After)."""

    status, code = 503, "formalizer_unavailable"


class FormalizerFailed(ServiceError):
    """The formalizer answered, but not usefully: an output still invalid after the one repair
    attempt, or an error retrying cannot fix (502)."""

    status, code = 502, "formalizer_output_invalid"


class AuditUnavailable(ServiceError):
    """The audit store cannot be reached or is busy: nothing was recorded, try again (503)."""

    status, code = 503, "audit_store_unavailable"


class InternalError(ServiceError):
    """An unexpected failure: answered as a 500 naming an incident id, logged without its message."""

    status, code = 500, "internal_error"


class KeysUnavailable(ServiceError):
    """The API key file cannot be read and no good copy was loaded before (503)."""

    status, code = 503, "keys_unavailable"


# -- HTTP: one error shape everywhere ---------------------------------------------------------------
_ERROR_TEXT = {
    401: "missing or invalid API key",
    403: "the key lacks the role",
    404: "not found",
    413: "request body too large",
    422: "invalid request: every invalid field is named",
}


def documented_errors(*, formalizer: bool = False) -> dict:
    """A key-checked route's `responses=` (its OpenAPI error statuses, each an ErrorBody); with
    `formalizer`, also 502 and 503 of a route that calls the students."""
    from .protocol import ErrorBody  # here, not at the top: the CLI's error classes stay a light import

    errors = {code: {"model": ErrorBody, "description": text} for code, text in _ERROR_TEXT.items()}
    if formalizer:
        errors[502] = {"model": ErrorBody, "description": "formalizer output invalid after one repair"}
        errors[503] = {"model": ErrorBody, "description": "formalizer down or slow; see Retry-After"}
    return errors


def json_position(doc, loc) -> str:
    """' at line L column C' of a JSON decoder's offset (the last item of `loc`) in `doc`, or ''."""
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    if pos is None or not isinstance(doc, str | bytes):
        return ""
    text = doc if isinstance(doc, str) else doc.decode("utf-8", "replace")
    line = text.count("\n", 0, pos) + 1
    return f" at line {line} column {pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"


def install_error_handlers(app, metrics) -> None:
    """ServiceError, invalid requests and Starlette's HTTP errors all answer an ErrorBody that names
    fields and never echoes the input; each is counted in `metrics.errors`."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from .protocol import ErrorBody, Problem
    from .serving import error_body  # serving imports this module: imported when installing

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
