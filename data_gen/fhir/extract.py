"""Validated FHIR resources -> the record's parts: notes (one document per DocumentReference or
DiagnosticReport) and coded facts (Condition, Observation, MedicationStatement/Request, Procedure).

Attachments: text/plain or text/html, inline (base64 `data`, already decoded by the model) or by
`url` through a fetcher the caller gives (the REST client, which applies the egress allowlist);
without one, a URL attachment is a problem, never a request.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pydantic import BaseModel
from verdict.core.errors import VerdictError
from verdict.core.formula import number_problem
from verdict.data_gen.formalizer import NoteDocument

from .code_map import CodeMap
from .errors import UnitConversionError
from .html_text import html_to_text
from .models import CodedFact, Coding, FactConversion
from .units import convert

UrlFetcher = Callable[[str], tuple[bytes, str | None]]  # url -> (body, content type)
TEXT_TYPES = ("text/plain", "text/html")


def ref(model: BaseModel) -> str:
    return f"{model.get_resource_type()}/{model.id}" if model.id else f"{model.get_resource_type()}/(no id)"


def iso(value: Any) -> str | None:
    """A FHIR date/dateTime/instant (date, datetime or partial string) as ISO text."""
    if value is None:
        return None
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value)


def subject_of(model: BaseModel) -> str | None:
    """The Patient id a resource belongs to (the Patient itself: its id)."""
    if model.get_resource_type() == "Patient":
        return model.id
    subject = getattr(model, "subject", None)
    reference = getattr(subject, "reference", None) if subject is not None else None
    if not reference:
        return None
    parts = reference.rstrip("/").split("/")
    if len(parts) >= 2 and parts[-2] == "Patient":
        return parts[-1]
    return reference  # e.g. urn:uuid:..., resolved by the bundle's fullUrl map


# ---- documents -------------------------------------------------------------------------------------
def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"').lower()
    return "utf-8"


def _attachment_text(
    att: Any, name: str, path: str, fetch: UrlFetcher | None, problems: list[str]
) -> str | None:
    content_type = (att.contentType or "").strip()
    if att.data is None and att.url:
        if fetch is None:
            problems.append(f"{name}: {path}.url: attachment by URL needs a FHIR server source; not read")
            return None
        try:
            body, served_type = fetch(att.url)
        except VerdictError as e:
            problems.append(f"{name}: {path}.url: {e.summary}")
            return None
        content_type = content_type or (served_type or "")
    elif att.data is not None:
        body = att.data
    else:
        return None  # nothing inline (or left out for its size: that problem is already recorded)
    media = content_type.split(";")[0].strip().lower()
    if media not in TEXT_TYPES:
        problems.append(
            f"{name}: {path}.contentType: '{media[:40] or 'none'}' is not read (only {', '.join(TEXT_TYPES)})"
        )
        return None
    try:
        text = body.decode(_charset(content_type))
    except (LookupError, UnicodeDecodeError):
        problems.append(f"{name}: {path}: text is not valid {_charset(content_type)[:20]}")
        return None
    text = html_to_text(text) if media == "text/html" else text.replace("\r\n", "\n").strip()
    return text or None


def _attachments(model: BaseModel) -> list[tuple[str, Any]]:
    if model.get_resource_type() == "DocumentReference":
        return [(f"content[{i}].attachment", c.attachment) for i, c in enumerate(model.content or [])]
    return [(f"presentedForm[{i}]", a) for i, a in enumerate(model.presentedForm or [])]


def document_of(model: BaseModel, fetch: UrlFetcher | None, problems: list[str]) -> NoteDocument | None:
    """One note per DocumentReference / DiagnosticReport: its first text/plain attachment (else the
    first text/html one; renditions of one content are alternatives, not separate notes)."""
    name = ref(model)
    atts = _attachments(model)
    ordered = sorted(atts, key=lambda pa: 0 if (pa[1].contentType or "").startswith("text/plain") else 1)
    text = None
    for path, att in ordered:
        text = _attachment_text(att, name, path, fetch, problems)
        if text:
            break
    if model.get_resource_type() == "DiagnosticReport" and not text and model.conclusion:
        text = model.conclusion.strip() or None
    if not text:
        if not atts:
            problems.append(f"{name}: no attachment; no document")
        elif not any(p.startswith(f"{name}:") for p in problems):  # never dropped without a word
            problems.append(f"{name}: the attachment holds no text (blank); no document")
        return None
    if model.get_resource_type() == "DocumentReference":
        date, kind = model.date, "document_reference"
    else:
        date, kind = (
            model.effectiveDateTime
            or (model.effectivePeriod and model.effectivePeriod.start)
            or model.issued,
            "diagnostic_report",
        )
    date_text = iso(date)
    return NoteDocument(id=name, text=text, date=date_text[:10] if date_text else None, kind=kind)


# ---- facts -----------------------------------------------------------------------------------------
def _codings(concept: Any) -> tuple[list[Coding], str | None]:
    if concept is None:
        return [], None
    codings = [Coding(system=c.system, code=c.code, display=c.display) for c in (concept.coding or [])]
    return codings, concept.text


def canonical_of(code_map: CodeMap, codings: list[Coding]) -> tuple[str, str] | None:
    for c in codings:
        found = code_map.lookup(c.system, c.code)
        if found:
            return found
    return None


def _status(concept_or_code: Any) -> str | None:
    if concept_or_code is None or isinstance(concept_or_code, str):
        return concept_or_code
    codings = concept_or_code.coding or []
    return codings[0].code if codings else concept_or_code.text


def _period_start(period: Any) -> Any:
    return period.start if period is not None else None


def _value(obs: Any, name: str, path: str, problems: list[str]) -> tuple[Any, str | None]:
    """(value, unit) of an Observation or component; a non-usable number is a problem."""
    if obs.valueQuantity is not None:
        q = obs.valueQuantity
        unit = q.code or q.unit
        if q.value is None:
            return None, unit
        number = float(q.value) if isinstance(q.value, Decimal) else q.value
        why = number_problem(number)
        if why:
            problems.append(f"{name}: {path}valueQuantity.value: {why}")
            return None, unit
        return number, unit
    if obs.valueInteger is not None:
        why = number_problem(obs.valueInteger)
        if why:
            problems.append(f"{name}: {path}valueInteger: {why}")
            return None, None
        return obs.valueInteger, None
    if obs.valueBoolean is not None:
        return obs.valueBoolean, None
    if obs.valueString is not None:
        return obs.valueString, None
    if obs.valueCodeableConcept is not None:
        codings, text = _codings(obs.valueCodeableConcept)
        return (codings[0].code if codings else text), None
    return None, None


def checked_fact(fact: CodedFact, code_map: CodeMap, problems: list[str]) -> CodedFact:
    """The fact, converted; a value outside its plausible range is refused: reported, value unset."""
    why = code_map.implausible(fact)
    if why is None:
        return _convert(fact, code_map)
    problems.append(why)
    return fact.model_copy(update={"value": None, "refused": why})


def _convert(fact: CodedFact, code_map: CodeMap) -> CodedFact:
    if fact.canonical is None or fact.canonical not in code_map.analytes:
        return fact
    if isinstance(fact.value, bool) or not isinstance(fact.value, (int, float)):
        return fact
    try:
        c = convert(float(fact.value), fact.unit, code_map.analytes[fact.canonical].unit, fact.canonical)
    except UnitConversionError as e:
        return fact.model_copy(update={"conversion_problem": e.summary})
    return fact.model_copy(update={"converted": FactConversion(value=c.value, unit=c.unit, rule=c.rule)})


def facts_of(model: BaseModel, code_map: CodeMap, problems: list[str]) -> list[CodedFact]:
    """The coded facts of one resource (an Observation panel gives one per component too)."""
    rtype, name = model.get_resource_type(), ref(model)
    out: list[CodedFact] = []

    def add(category, concept, *, value=None, unit=None, effective=None, status=None, component=None):
        codings, text = _codings(concept)
        found = canonical_of(code_map, codings)
        fact = CodedFact(
            resource=name,
            category=category,
            component=component,
            codings=codings,
            text=text,
            canonical=found[1] if found else None,
            value=value,
            unit=unit,
            effective=iso(effective),
            status=status,
        )
        out.append(checked_fact(fact, code_map, problems))

    if rtype == "Condition":
        add(
            "condition",
            model.code,
            effective=model.onsetDateTime or _period_start(model.onsetPeriod) or model.recordedDate,
            status=_status(model.clinicalStatus),
        )
    elif rtype == "Observation":
        effective = model.effectiveDateTime or model.effectiveInstant or _period_start(model.effectivePeriod)
        value, unit = _value(model, name, "", problems)
        if value is not None or not model.component:
            add("observation", model.code, value=value, unit=unit, effective=effective, status=model.status)
        for i, comp in enumerate(model.component or []):
            value, unit = _value(comp, name, f"component[{i}].", problems)
            add(
                "observation",
                comp.code,
                value=value,
                unit=unit,
                effective=effective,
                status=model.status,
                component=i,
            )
    elif rtype in ("MedicationStatement", "MedicationRequest"):
        if model.medicationCodeableConcept is None:
            problems.append(
                f"{name}: medicationReference is not followed; only medicationCodeableConcept is read"
            )
            return out
        effective = (
            model.effectiveDateTime or _period_start(model.effectivePeriod) or model.dateAsserted
            if rtype == "MedicationStatement"
            else model.authoredOn
        )
        add("medication", model.medicationCodeableConcept, effective=effective, status=model.status)
    elif rtype == "Procedure":
        add(
            "procedure",
            model.code,
            effective=model.performedDateTime or _period_start(model.performedPeriod),
            status=model.status,
        )
    return out
