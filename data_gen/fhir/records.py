"""Validated resources -> one FhirPatientRecord per patient, at a stated reference date.

Deterministic: documents are ordered by (date, id), facts by (resource, component), so a bundle,
an NDJSON export and a REST server holding the same resources give the same records.
"""

from __future__ import annotations

import datetime as dt
import logging

from .code_map import CodeMap
from .extract import UrlFetcher, document_of, facts_of, ref, subject_of
from .models import FhirPatientRecord
from .validate import Validated

log = logging.getLogger("verdict.data_gen.fhir")


def age_at(birth: str, at: dt.date) -> tuple[int, int] | None:
    """(youngest, oldest) full years at `at` for a birth date YYYY, YYYY-MM or YYYY-MM-DD."""
    parts = [int(p) for p in birth.split("-")[:3]]
    if not parts:
        return None
    year = parts[0]
    if len(parts) == 3:
        first = last = dt.date(year, parts[1], parts[2])
    elif len(parts) == 2:
        first = dt.date(year, parts[1], 1)
        last = dt.date(year + (parts[1] == 12), parts[1] % 12 + 1, 1) - dt.timedelta(days=1)
    else:
        first, last = dt.date(year, 1, 1), dt.date(year, 12, 31)

    def years(born: dt.date) -> int:
        return at.year - born.year - ((at.month, at.day) < (born.month, born.day))

    return years(last), years(first)


def birth_fields(
    birth: str, at: dt.date, code_map: CodeMap, where: str, problems: list[str]
) -> tuple[str | None, int | None, tuple[int, int] | None]:
    """(birth date kept, age in full years, possible ages) of a birth date at `at`: an exact date gives
    the age, a partial one the range; one after `at` gives neither, one giving an age over the plausible
    maximum is refused (`where`: the row or resource and field, named in the problem; never the value)."""
    span = age_at(birth, at)
    too_old = code_map.dates.age_problem(span[1]) if span is not None else None
    if span is None or span[0] < 0:
        problems.append(f"{where}: after the reference date {at.isoformat()}")
    elif too_old:
        problems.append(f"{where}: {too_old}; not used")
        return None, None, None
    elif span[0] == span[1]:
        return birth, span[0], None
    else:
        return birth, None, (max(span[0], 0), span[1])
    return birth, None, None


def build_records(
    validated: Validated,
    at: dt.date,
    code_map: CodeMap,
    *,
    fetch: UrlFetcher | None = None,
    aliases: dict[str, str] | None = None,
    only: str | None = None,
) -> tuple[list[FhirPatientRecord], list[str]]:
    """One record per patient the resources name (`only`: that Patient id alone), and the problems
    of resources whose patient is not known (too broken to say, or no subject)."""
    aliases = aliases or {}
    groups: dict[str, list] = {}
    problems: dict[str, list[str]] = {}
    seen: set[str] = set()
    orphans = 0
    for model in validated.resources:
        name = ref(model)
        pid = subject_of(model)
        pid = aliases.get(pid, pid) if pid else None
        if pid is None or "/" in pid or ":" in pid:  # no subject, or a reference that is not Patient/id
            orphans += 1
            problems.setdefault("", []).append(f"{name}: subject is not a Patient of this source; not read")
            continue
        if name in seen and model.id:
            problems.setdefault(pid, []).append(f"{name}: appears more than once; the first is kept")
            continue
        seen.add(name)
        groups.setdefault(pid, []).append(model)
    for hint, problem in validated.problems:
        pid = aliases.get(hint, hint) if hint else None
        problems.setdefault(pid if pid in groups else "", []).append(problem)
    if orphans:
        log.warning("%d resource(s) name no Patient subject and were not read", orphans)
    records = [
        _record(pid, groups[pid], at, code_map, fetch, problems.get(pid, []))
        for pid in sorted(groups)
        if only is None or pid == only
    ]
    return records, problems.get("", [])


def _record(
    pid: str, models: list, at: dt.date, code_map: CodeMap, fetch: UrlFetcher | None, problems: list[str]
) -> FhirPatientRecord:
    problems = list(problems)
    patient = next((m for m in models if m.get_resource_type() == "Patient"), None)
    birth = gender = None
    age = age_range = None
    if patient is None:
        problems.append(f"Patient/{pid}: not in the source; no birth date or gender")
    else:
        gender = patient.gender
        if patient.birthDate is not None:
            given = (
                patient.birthDate.isoformat()
                if isinstance(patient.birthDate, dt.date)
                else str(patient.birthDate)
            )
            birth, age, age_range = birth_fields(given, at, code_map, f"Patient/{pid}: birthDate", problems)
    documents, facts = [], []
    for m in models:
        rtype = m.get_resource_type()
        if rtype in ("DocumentReference", "DiagnosticReport"):
            doc = document_of(m, fetch, problems)
            if doc is not None:
                documents.append(doc)
        elif rtype != "Patient":
            facts += facts_of(m, code_map, problems)
    documents.sort(key=lambda d: (d.date or "", d.id))
    facts.sort(key=lambda f: (f.resource, -1 if f.component is None else f.component))
    return FhirPatientRecord(
        patient_id=pid,
        reference_date=at.isoformat(),
        birth_date=birth,
        gender=gender,
        age_years=age,
        age_range=age_range,
        documents=documents,
        facts=facts,
        problems=sorted(problems),
    )
