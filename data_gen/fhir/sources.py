"""The three FHIR sources, one loader: a Bundle JSON file, a Bulk Data export folder (NDJSON per
resource type), or a REST server (https URL). Each gives the same `LoadResult`: the records, and
the problems no single patient owns (unreadable lines, resources without a subject), all by
resource id or file position, never by content.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verdict.data_gen.formalizer import EgressRefused

from .code_map import CodeMap, load_code_map
from .errors import FhirSourceError
from .models import FhirPatientRecord
from .records import build_records
from .rest import FhirRestClient, FhirRestConfig
from .validate import MAX_ATTACHMENT_BYTES, parse_json, validate_all


@dataclass
class LoadResult:
    source: str  # what was read, as the user named it (a path or a base URL: never patient data)
    kind: str  # bundle | ndjson | rest
    records: list[FhirPatientRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped_types: dict[str, int] = field(default_factory=dict)


def bundle_resources(path: Path) -> tuple[list[tuple[Any, str]], dict[str, str]]:
    """(raw resource, where) per entry, and fullUrl -> Patient id (for urn:uuid references)."""
    try:
        raw = parse_json(path.read_bytes(), f"bundle {path.name}")
    except OSError as e:
        raise FhirSourceError(f"bundle {path.name}: cannot be read ({e.strerror})") from None
    if not isinstance(raw, dict) or raw.get("resourceType") != "Bundle":
        raise FhirSourceError(f"{path.name}: not a FHIR Bundle (resourceType must be 'Bundle')")
    entries = raw.get("entry") or []
    if not isinstance(entries, list):
        raise FhirSourceError(f"bundle {path.name}: entry must be a list")
    out, aliases = [], {}
    for i, entry in enumerate(entries):
        resource = entry.get("resource") if isinstance(entry, dict) else None
        out.append((resource, f"entry[{i}]"))
        full = entry.get("fullUrl") if isinstance(entry, dict) else None
        if isinstance(resource, dict) and resource.get("resourceType") == "Patient" and isinstance(full, str):
            if isinstance(resource.get("id"), str):
                aliases[full] = resource["id"]
    return out, aliases


def ndjson_resources(folder: Path) -> tuple[list[tuple[Any, str]], list[str]]:
    """(raw resource, 'FILE line N') for every line of every *.ndjson file; unreadable lines as problems."""
    files = sorted(folder.glob("*.ndjson")) if folder.is_dir() else [folder]
    if not files:
        raise FhirSourceError(
            f"{folder.name}: no *.ndjson files (a Bulk Data export folder has one per type)"
        )
    out, problems = [], []
    for f in files:
        try:
            handle = f.open("rb")
        except OSError as e:
            problems.append(f"{f.name}: cannot be read ({e.strerror})")
            continue
        with handle:
            for n, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                where = f"{f.name} line {n}"
                try:
                    out.append((parse_json(line, where), where))
                except FhirSourceError as e:
                    problems.append(e.summary)
    return out, problems


def load_source(
    source: str,
    at: dt.date,
    *,
    patient: str | None = None,
    code_map: CodeMap | None = None,
    rest: FhirRestConfig | None = None,
    max_attachment_bytes: int = MAX_ATTACHMENT_BYTES,
    bearer: str | None = None,
) -> LoadResult:
    """Read `source` (bundle file, NDJSON folder or file, http(s) base URL) into records at `at`.
    `bearer`: a server's token handed to the caller (else the one `rest.token_env` names)."""
    code_map = checked_reference_date(at, code_map, FhirSourceError)
    if source.startswith(("http://", "https://")):
        return _load_rest(rest or FhirRestConfig(base_url=source), at, patient, code_map, bearer)
    path = Path(source)
    if not path.exists():
        raise FhirSourceError(
            f"FHIR source '{source}' does not exist (give a bundle .json, an NDJSON folder or an https URL)"
        )
    if path.is_dir() or path.suffix == ".ndjson":
        raws, problems = ndjson_resources(path)
        aliases, kind = {}, "ndjson"
    else:
        (raws, aliases), problems, kind = bundle_resources(path), [], "bundle"
    validated = validate_all(raws, max_attachment_bytes)
    records, orphan_problems = build_records(validated, at, code_map, aliases=aliases, only=patient)
    if patient is not None and not records:
        raise FhirSourceError(f"Patient/{patient} is not in {path.name}")
    return LoadResult(source, kind, records, problems + orphan_problems, validated.skipped_types)


def checked_reference_date(at, code_map: CodeMap | None, error: type[Exception]) -> CodeMap:
    """The code map a source reads with (the site's by default), once the reference date is known
    good: a missing or implausible one is refused with the source's own `error`."""
    if not isinstance(at, dt.date):
        raise error("a reference date is required (ages are computed at it, never at 'today')")
    code_map = code_map or load_code_map()
    implausible = code_map.dates.reference_date_problem(at)
    if implausible:
        raise error(
            f"reference date {at.isoformat()} is {implausible} (plausible dates: configs/fhir/codes.yaml)"
        )
    return code_map


def prefetch_source(
    prefetch: dict[str, Any], at: dt.date, patient: str, code_map: CodeMap | None = None
) -> LoadResult:
    """A CDS Hooks call's `prefetch` (each value a resource or a searchset Bundle, by template key) as
    the record of `patient`; problems named by key and entry, never by content."""
    raws: list[tuple[Any, str]] = []
    for key, value in prefetch.items():
        if isinstance(value, dict) and value.get("resourceType") == "Bundle":
            entries = value.get("entry") if isinstance(value.get("entry"), list) else []
            for i, entry in enumerate(entries):
                raws.append(
                    (entry.get("resource") if isinstance(entry, dict) else None, f"prefetch {key} entry[{i}]")
                )
        elif value is not None:
            raws.append((value, f"prefetch {key}"))
    validated = validate_all(raws)
    records, problems = build_records(validated, at, code_map or load_code_map(), only=patient)
    return LoadResult("prefetch", "prefetch", records, problems, validated.skipped_types)


def _load_rest(
    cfg: FhirRestConfig, at: dt.date, patient: str | None, code_map: CodeMap, bearer: str | None = None
) -> LoadResult:
    result = LoadResult(cfg.base_url, "rest")
    with FhirRestClient(cfg, bearer=bearer) as client:  # refuses a non-allowlisted host before any request
        ids = [patient] if patient is not None else client.patient_ids(result.problems)
        for pid in ids:
            problems: list[str] = []
            try:
                found = client.patient_resources(pid, problems)
            except (FhirSourceError, EgressRefused) as e:  # e.g. a next link off the allowlist
                if patient is not None:
                    raise
                result.problems.append(f"Patient/{pid}: not read: {e.summary}")  # the others still load
                continue
            raws = [(r, f"Patient/{pid} $everything/search") for r in found]
            validated = validate_all(raws, cfg.max_attachment_bytes)
            validated.problems = [(pid, p) for p in problems] + validated.problems
            records, orphans = build_records(validated, at, code_map, fetch=client.fetch_attachment, only=pid)
            result.records += records
            result.problems += orphans
            for k, v in validated.skipped_types.items():
                result.skipped_types[k] = result.skipped_types.get(k, 0) + v
    return result
