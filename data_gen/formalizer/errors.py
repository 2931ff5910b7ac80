"""Errors of the formalizer. All are VerdictErrors: the CLI prints `error: <message>`, exit 2. A
malformed or unknown endpoint, run or prompt config is the core's one `ConfigError`.

Messages name the problem and how to fix it; they never quote patient text.
"""

from __future__ import annotations

from verdict.core.configs import ConfigError
from verdict.core.errors import VerdictError

__all__ = ["BudgetExhausted", "ConfigError", "EgressRefused", "EndpointError", "SourceError"]


class SourceError(VerdictError):
    """An input file (trials, patients, pairs, study JSON) cannot be read at all."""


class EgressRefused(VerdictError):
    """A request carrying patient text would go to a host the site has not allowed."""


class EndpointError(VerdictError):
    """The endpoint failed in a way retrying does not fix (or retries ran out)."""

    def __init__(
        self,
        message: str,
        problems: list[str] | None = None,
        *,
        status: int | None = None,
        retryable: bool = False,
    ):
        super().__init__(message, problems)
        self.status = status
        self.retryable = retryable


class BudgetExhausted(VerdictError):
    """The next paid call could push the run past its budget; nothing more is sent."""
