"""Errors the core raises on bad input. Each names the problem and where it is."""

from __future__ import annotations

from pydantic import ValidationError


class VerdictError(ValueError):
    """Base class: bad input the user can fix. Carries a list of problems, each with a location."""

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = problems or []
        full = message if not self.problems else message + ":\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(full)
        self.summary = message


class ProgramError(VerdictError):
    """The trial program is malformed, ill-typed, or unsatisfiable."""


class PatientError(VerdictError):
    """The resolved patient does not fit the trial program."""


class PolicyError(VerdictError):
    """A policy file is malformed or unknown."""


class ImportFormatError(VerdictError):
    """A reference-format file could not be imported."""


def describe_validation_error(err: ValidationError, what: str) -> list[str]:
    """Turn pydantic's errors into short 'where: what' lines (no tracebacks, no input echo)."""
    lines = []
    for e in err.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in e["loc"]) or what
        lines.append(f"{loc}: {e['msg']}")
    # Deeply nested unions report one error per alternative; keep the list readable.
    if len(lines) > 12:
        lines = lines[:12] + [f"... and {len(lines) - 12} more"]
    return lines
