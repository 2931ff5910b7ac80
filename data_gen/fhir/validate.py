"""JSON in, validated FHIR R4 resources out: one resource at a time, so one bad resource never stops
the others.

Models are `fhir.resources.R4B` (pydantic v2): R4B is the R4-compatible release of the R4 model
set fhir.resources ships (its default package is R5). A problem names the resource (`Type/id`,
or its position when it has no id), the failing field path and pydantic's message, never a value:
a message that would quote the input is replaced by the error type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from .errors import FhirSourceError

# The resource types the record is made of; others are counted and skipped.
READ_TYPES = (
    "Patient",
    "DocumentReference",
    "DiagnosticReport",
    "Condition",
    "Observation",
    "MedicationStatement",
    "MedicationRequest",
    "Procedure",
)
MAX_DEPTH = 64  # JSON nesting deeper than this is refused (a real resource is under ~15 levels)
MAX_ATTACHMENT_BYTES = 10 * 1024 * 1024  # decoded size of one inline attachment


@dataclass
class Validated:
    """What validating a batch of raw resources gave: the models, and problems by resource."""

    resources: list[BaseModel] = field(default_factory=list)
    # (the Patient id the raw resource points at, if any; the problem)
    problems: list[tuple[str | None, str]] = field(default_factory=list)
    skipped_types: dict[str, int] = field(default_factory=dict)


def reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON without NaN/Infinity; FhirSourceError naming `where` (never the content) otherwise."""
    try:
        return json.loads(text, parse_constant=reject_constant)
    except RecursionError:
        raise FhirSourceError(f"{where}: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        raise FhirSourceError(f"{where}: not valid JSON ({e.msg} at character {e.pos})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise FhirSourceError(f"{where}: not valid JSON ({e})") from None


def label(raw: Any, where: str) -> str:
    """How problems name a resource: Type/id, or Type at `where` when it has no usable id."""
    if not isinstance(raw, dict):
        return where
    rtype = raw.get("resourceType") if isinstance(raw.get("resourceType"), str) else "resource"
    rid = raw.get("id")
    if isinstance(rid, str) and rid and len(rid) <= 64 and all(c.isalnum() or c in "-." for c in rid):
        return f"{rtype[:40]}/{rid}"
    return f"{rtype[:40]} at {where}"


def _depth_exceeds(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:  # iterative: a hostile nesting must not exhaust the Python stack here
        node, d = stack.pop()
        if d > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, d + 1) for v in node)
    return False


def _drop_oversized_attachments(raw: dict, name: str, limit: int) -> list[str]:
    """Remove inline attachment data over `limit` bytes (decoded), with a problem for each."""
    problems = []
    paths = []
    if raw.get("resourceType") == "DocumentReference" and isinstance(raw.get("content"), list):
        paths = [
            (f"content[{i}].attachment", c.get("attachment"))
            for i, c in enumerate(raw["content"])
            if isinstance(c, dict)
        ]
    elif raw.get("resourceType") == "DiagnosticReport" and isinstance(raw.get("presentedForm"), list):
        paths = [(f"presentedForm[{i}]", a) for i, a in enumerate(raw["presentedForm"])]
    for path, att in paths:
        if isinstance(att, dict) and isinstance(att.get("data"), str) and len(att["data"]) * 3 // 4 > limit:
            size = len(att["data"]) * 3 // 4
            problems.append(
                f"{name}: {path}.data: attachment is {size / 2**20:.1f} MiB, over the limit of "
                f"{limit / 2**20:.0f} MiB; left out"
            )
            att.pop("data")
    return problems


def describe(err: ValidationError, name: str) -> list[str]:
    """`name: field.path: message` lines; never the input."""
    lines = []
    for e in err.errors(include_url=False):
        path = ".".join(str(p) for p in e["loc"]) or "resource"
        msg = e["msg"]
        given = e.get("input")
        if (
            isinstance(given, (str, int, float))
            and not isinstance(given, bool)
            and str(given)
            and str(given) in msg
        ):
            msg = e["type"]  # the message quotes the value
        lines.append(f"{name}: {path}: {msg[:160]}")
    if len(lines) > 8:
        lines = lines[:8] + [f"{name}: ... and {len(lines) - 8} more"]
    return lines


def patient_hint(raw: Any) -> str | None:
    """The Patient id a raw (maybe invalid) resource names, so its problems reach that patient."""
    if not isinstance(raw, dict):
        return None
    if raw.get("resourceType") == "Patient":
        return raw.get("id") if isinstance(raw.get("id"), str) else None
    for key in ("subject", "patient"):
        ref = raw.get(key)
        if isinstance(ref, dict) and isinstance(ref.get("reference"), str):
            parts = ref["reference"].rstrip("/").split("/")
            return parts[-1] if len(parts) >= 2 and parts[-2] == "Patient" else ref["reference"]
    return None


def validate_resource(
    raw: Any, where: str, out: Validated, max_attachment_bytes: int = MAX_ATTACHMENT_BYTES
) -> BaseModel | None:
    """Validate one raw resource into `out` (a model or problems); returns the model or None."""
    from fhir.resources.R4B import get_fhir_model_class

    name = label(raw, where)
    hint = patient_hint(raw)
    problems: list[str] = []
    model = _validate(raw, name, problems, max_attachment_bytes, get_fhir_model_class, out)
    out.problems.extend((hint, p) for p in problems)
    if model is not None:
        out.resources.append(model)
    return model


def _validate(raw, name, problems, max_attachment_bytes, model_class, out) -> BaseModel | None:
    if not isinstance(raw, dict):
        problems.append(f"{name}: not a JSON object")
        return None
    rtype = raw.get("resourceType")
    if not isinstance(rtype, str) or not rtype:
        problems.append(f"{name}: resourceType: missing")
        return None
    if rtype not in READ_TYPES:
        out.skipped_types[rtype[:40]] = out.skipped_types.get(rtype[:40], 0) + 1
        return None
    if _depth_exceeds(raw, MAX_DEPTH):
        problems.append(f"{name}: nested deeper than {MAX_DEPTH} levels; not read")
        return None
    problems.extend(_drop_oversized_attachments(raw, name, max_attachment_bytes))
    try:
        return model_class(rtype).model_validate(raw)
    except ValidationError as e:
        problems.extend(describe(e, name))
    except (RecursionError, ValueError, TypeError) as e:  # a validator that fails outside pydantic
        problems.append(f"{name}: not a valid {rtype} ({type(e).__name__})")
    return None


def validate_all(raws: list[tuple[Any, str]], max_attachment_bytes: int = MAX_ATTACHMENT_BYTES) -> Validated:
    """Validate (raw resource, where) pairs; problems for the bad ones, the others kept."""
    out = Validated()
    for raw, where in raws:
        validate_resource(raw, where, out, max_attachment_bytes)
    return out
