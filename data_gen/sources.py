"""Loaders for the teacher pipeline's inputs.

- trials: JSONL in the `../shared/data/benchmarks` layout (`nct_id`, `title`, `inclusion`,
  `exclusion`, `criteria`), or ClinicalTrials.gov study JSON (API v2 `protocolSection`, a list of
  studies, `{"studies": [...]}`, or the classic `FullStudy` shape; a file or a folder of files);
- patients: JSONL `{"_id", "text", "metadata"}`;
- pairs: JSONL `{"patient_id", "nct_id", "score"}`.

A malformed row is reported (file, line, what is wrong) and skipped; it never stops the load.
Problem messages name fields, never patient text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import ValidationError
from verdict.core.errors import describe_validation_error
from verdict.data_gen.formalizer import Pair, PatientDoc, SourceError, TrialDoc

T = TypeVar("T")
_EXCLUSION_HEADING = re.compile(r"^\s*exclusion criteria\s*:?", re.IGNORECASE | re.MULTILINE)
_INCLUSION_HEADING = re.compile(r"^\s*inclusion criteria\s*:?", re.IGNORECASE | re.MULTILINE)


@dataclass
class Loaded(Generic[T]):
    items: list[T] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def by_id(self, attr: str) -> dict[str, T]:
        return {getattr(x, attr): x for x in self.items}


def _rows(path: Path) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed object or None, problem or None) for each non-blank line."""
    if not path.exists():
        raise SourceError(f"no such file: {path}")
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield n, json.loads(line), None
                except ValueError as e:
                    yield n, None, f"{path.name}:{n}: not valid JSON ({e.msg})"
    except UnicodeDecodeError:
        raise SourceError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise SourceError(f"cannot read {path}: {e.strerror}") from None


def _select(
    items: list[T], attr: str, ids: list[str] | None, limit: int | None, what: str, problems: list[str]
) -> list[T]:
    if ids is not None:
        have = {getattr(x, attr): x for x in items}
        missing = [i for i in ids if i not in have]
        if missing:
            problems.append(
                f"{what} ids not found: {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else "")
            )
        items = [have[i] for i in ids if i in have]
    return items[:limit] if limit is not None else items


def _dedupe(items: list[T], attr: str, what: str, problems: list[str]) -> list[T]:
    seen: set[str] = set()
    out = []
    for x in items:
        k = getattr(x, attr)
        if k in seen:
            problems.append(f"duplicate {what} id '{k}': first occurrence kept")
            continue
        seen.add(k)
        out.append(x)
    return out


# ---- trials -----------------------------------------------------------------------------------------
def split_criteria(text: str) -> tuple[str | None, str | None]:
    """Split raw criteria at their 'Inclusion Criteria:' / 'Exclusion Criteria:' headings."""
    m = _EXCLUSION_HEADING.search(text)
    if not m:
        return None, None
    inc = _INCLUSION_HEADING.sub("", text[: m.start()], count=1).strip()
    exc = text[m.end() :].strip()
    return inc or None, exc or None


def load_trials(
    path: str | Path, format: str = "auto", ids: list[str] | None = None, limit: int | None = None
) -> Loaded[TrialDoc]:
    p = Path(path)
    fmt = format if format != "auto" else ("jsonl" if p.suffix == ".jsonl" else "ctgov")
    out: Loaded[TrialDoc] = Loaded()
    items = list(_trials_jsonl(p, out.problems) if fmt == "jsonl" else _trials_ctgov(p, out.problems))
    items = _dedupe(items, "trial_id", "trial", out.problems)
    out.items = _select(items, "trial_id", ids, limit, "trial", out.problems)
    return out


def _trials_jsonl(path: Path, problems: list[str]) -> Iterator[TrialDoc]:
    for n, row, problem in _rows(path):
        if problem:
            problems.append(problem)
            continue
        if not isinstance(row, dict):
            problems.append(f"{path.name}:{n}: expected a JSON object")
            continue
        tid = row.get("nct_id") or row.get("trial_id")
        if not isinstance(tid, str) or not tid:
            problems.append(f"{path.name}:{n}: no 'nct_id'")
            continue
        inc, exc, crit = (row.get(k) for k in ("inclusion", "exclusion", "criteria"))
        bad = [
            k
            for k, v in (
                ("inclusion", inc),
                ("exclusion", exc),
                ("criteria", crit),
                ("title", row.get("title")),
            )
            if v is not None and not isinstance(v, str)
        ]
        if bad:
            problems.append(f"{path.name}:{n}: trial '{tid}': {', '.join(bad)} must be text")
            continue
        if not any(x and x.strip() for x in (inc, exc, crit)):
            problems.append(f"{path.name}:{n}: trial '{tid}' has no criteria text")
            continue
        yield TrialDoc(
            trial_id=tid,
            title=row.get("title") or "",
            inclusion=inc or None,
            exclusion=exc or None,
            criteria=crit or "",
            source=f"{path.name}:{n}",
        )


def _ci(d: Any, *keys: str) -> Any:
    """Nested lookup tolerant of the classic API's CapitalizedKeys."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d[k] if k in d else next((v for kk, v in d.items() if kk.lower() == k.lower()), None)
    return d


def _trials_ctgov(path: Path, problems: list[str]) -> Iterator[TrialDoc]:
    if not path.exists():
        raise SourceError(f"no such file or folder: {path}")
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    for f in files:
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except ValueError as e:
            problems.append(f"{f.name}: not valid JSON ({e})")
            continue
        except OSError as e:
            problems.append(f"{f.name}: cannot read ({e.strerror})")
            continue
        yield from ctgov_studies(data, f.name, problems)


def ctgov_studies(data, name: str, problems: list[str]) -> Iterator[TrialDoc]:
    """The studies of one parsed ClinicalTrials.gov document (a study, a list of them, or an API page
    with `studies`); `name` says where it came from in problems (a file name, or 'study')."""
    studies = data.get("studies") if isinstance(data, dict) and "studies" in data else data
    studies = studies if isinstance(studies, list) else [studies]
    for i, st in enumerate(studies):
        where = f"{name}" + (f"[{i}]" if len(studies) > 1 else "")
        st = _ci(st, "fullStudy", "study") or st
        proto = _ci(st, "protocolSection")
        nct = _ci(proto, "identificationModule", "nctId")
        text = _ci(proto, "eligibilityModule", "eligibilityCriteria")
        if not isinstance(nct, str) or not nct:
            problems.append(f"{where}: no protocolSection.identificationModule.nctId")
            continue
        if not isinstance(text, str) or not text.strip():
            problems.append(f"{where}: study '{nct}' has no eligibilityModule.eligibilityCriteria")
            continue
        inc, exc = split_criteria(text)
        title = _ci(proto, "identificationModule", "briefTitle") or _ci(
            proto, "identificationModule", "officialTitle"
        )
        yield TrialDoc(
            trial_id=nct,
            title=title if isinstance(title, str) else "",
            inclusion=inc,
            exclusion=exc,
            criteria=text,
            source=where,
        )


# ---- patients and pairs -----------------------------------------------------------------------------
def load_patients(
    path: str | Path, ids: list[str] | None = None, limit: int | None = None, data_class: str = "private"
) -> Loaded[PatientDoc]:
    p = Path(path)
    out: Loaded[PatientDoc] = Loaded()
    items = []
    for n, row, problem in _rows(p):
        if problem:
            out.problems.append(problem)
            continue
        pid = row.get("_id", row.get("patient_id")) if isinstance(row, dict) else None
        text = row.get("text") if isinstance(row, dict) else None
        docs = row.get("documents") if isinstance(row, dict) else None
        if isinstance(row, dict) and row.get("format") == FHIR_RECORD:  # a `verdict fhir load --out` line
            doc, problem = _fhir_patient(row, data_class, f"{p.name}:{n}")
            if doc is not None:
                items.append(doc)
            else:
                out.problems.append(problem)
        elif not isinstance(pid, str) or not pid:
            out.problems.append(f"{p.name}:{n}: no '_id'")
        elif docs is not None and text is None:  # several documents: [{"id", "text", "date"?, "kind"?}]
            try:
                items.append(PatientDoc(patient_id=pid, documents=docs, data_class=data_class))
            except ValidationError as e:
                why = "; ".join(describe_validation_error(e, "patient")[:3])
                out.problems.append(f"{p.name}:{n}: patient '{pid}' has invalid 'documents' ({why})")
        elif not isinstance(text, str) or not text.strip():
            out.problems.append(f"{p.name}:{n}: patient '{pid}' has no 'text'")
        else:
            items.append(PatientDoc(patient_id=pid, text=text, data_class=data_class))
    items = _dedupe(items, "patient_id", "patient", out.problems)
    out.items = _select(items, "patient_id", ids, limit, "patient", out.problems)
    return out


FHIR_RECORD = "verdict.fhir_patient/v1"


def _fhir_patient(row: dict, data_class: str, where: str) -> tuple[PatientDoc | None, str]:
    """A FHIR patient record line as a patient: its documents, the record kept for its coded facts.
    A bad line is named by its place and patient id, never by its content."""
    from .fhir.models import FhirPatientRecord

    pid = row.get("patient_id") if isinstance(row.get("patient_id"), str) else "?"
    try:
        rec = FhirPatientRecord.model_validate(row)
    except ValidationError as e:
        return (
            None,
            f"{where}: FHIR record of patient '{pid}' is invalid "
            f"({'; '.join(describe_validation_error(e, 'record')[:3])})",
        )
    doc = rec.patient_doc()
    if doc is None:
        return None, f"{where}: FHIR record of patient '{pid}' has no document for the value miner"
    return doc.model_copy(update={"data_class": data_class, "fhir": rec.model_dump(mode="json")}), ""


def load_pairs(path: str | Path, scores: list[int] | None = None, limit: int | None = None) -> Loaded[Pair]:
    p = Path(path)
    out: Loaded[Pair] = Loaded()
    seen: set[tuple[str, str]] = set()
    for n, row, problem in _rows(p):
        if problem:
            out.problems.append(problem)
            continue
        pid = row.get("patient_id") if isinstance(row, dict) else None
        tid = (row.get("nct_id") or row.get("trial_id")) if isinstance(row, dict) else None
        score = row.get("score") if isinstance(row, dict) else None
        if not isinstance(pid, str) or not isinstance(tid, str):
            out.problems.append(f"{p.name}:{n}: needs 'patient_id' and 'nct_id'")
            continue
        if score is not None and (not isinstance(score, int) or isinstance(score, bool)):
            out.problems.append(f"{p.name}:{n}: 'score' must be an integer")
            continue
        if scores is not None and score not in scores:
            continue
        if (pid, tid) in seen:
            continue
        seen.add((pid, tid))
        out.items.append(Pair(patient_id=pid, trial_id=tid, score=score))
    if limit is not None:
        out.items = out.items[:limit]
    return out
