"""Errors the core raises on bad input. Each names the problem and where it is."""

from __future__ import annotations

from pydantic import ValidationError


class VerdictError(ValueError):
    """Base class: bad input the user can fix. Carries a list of problems, each with a location."""

    def __init__(self, message: str, problems: list[str] | None = None):
        self.problems = problems or []
        full = (
            message if not self.problems else message + ":\n" + "\n".join(f"  - {p}" for p in self.problems)
        )
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


class UnsupportedConstructError(ImportFormatError):
    """A reference-format file uses a construct that cannot be imported soundly (for example a
    quantifier inside a criterion): the file is refused rather than imported with another meaning."""


def describe_validation_error(err: ValidationError, what: str) -> list[str]:
    """Turn pydantic's errors into short 'where: what' lines (no tracebacks, no input echo). The
    location names fields and indexes only; for a formula, the alternatives a union tried in vain
    ("should be a valid string" for a node that is clearly an object) are left out when a more
    specific problem deeper in the same place explains it."""
    found = []
    for e in err.errors(include_url=False, include_input=False):
        loc = tuple(str(p) for p in e["loc"] if not _internal_loc(p))
        found.append((loc, e["type"], e["msg"]))
    kept = [
        (loc, msg)
        for loc, kind, msg in found
        if not (
            kind in ("string_type", "model_type", "dict_type", "model_attributes_type")
            and any(
                other[: len(loc)] == loc and (len(other) > len(loc) or k2 == "value_error")
                for other, k2, _ in found
                if (other, k2) != (loc, kind)
            )
        )
    ]
    lines = list(
        dict.fromkeys(
            f"{'.'.join(loc) or what}: {msg}" for loc, msg in kept or [(lc, m) for lc, _, m in found]
        )
    )
    # Deeply nested unions report one error per alternative; keep the list readable.
    if len(lines) > 12:
        lines = lines[:12] + [f"... and {len(lines) - 12} more"]
    return lines


def _internal_loc(part) -> bool:
    # pydantic names its validator steps in the location: function-after[...], tagged-union[...]
    return isinstance(part, str) and (
        "[" in part or part in ("constrained-str", "function-after", "function-before")
    )
