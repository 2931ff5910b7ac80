"""Errors of the serving part. All are VerdictErrors: the CLI prints `error: <message>`, exit 2.

Messages never quote patient text: they name fields, ids and hashes only. Over HTTP,
`serve/error_mapping.py` answers them (and FastAPI's own errors) in the one ErrorBody shape.
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
