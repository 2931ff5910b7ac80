"""What `verdict fhir load` and `verdict omop load` print of a load, per patient: age, documents (ids,
dates, sizes), facts (row or resource, canonical name, value, conversion), problems; and the records
written as JSONL (`--out`: the lines `verdict match batch --patients` reads). Never a document's text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from .models import FhirPatientRecord
from .sources import LoadResult


def show_result(result: LoadResult, out: Path | None) -> None:
    for rec in result.records:
        age = (
            rec.age_years
            if rec.age_years is not None
            else (f"{rec.age_range[0]}-{rec.age_range[1]}" if rec.age_range else "unknown")
        )
        typer.echo(
            f"{rec.patient_ref}: age {age} at {rec.reference_date}, gender {rec.gender or 'unknown'}; "
            f"{len(rec.documents)} documents, {len(rec.facts)} facts, {len(rec.conversions())} conversions, "
            f"{len(rec.problems)} problems"
        )
        for d in rec.documents:
            typer.echo(f"  document {d.id} {d.date or 'undated'} ({len(d.text)} chars)")
        for f in rec.facts:
            code = f.code
            what = f.canonical or (f"{code.system}|{code.code}" if code else "uncoded")
            value = (
                ""
                if f.value is None or not isinstance(f.value, (int, float))
                else f" {f.value:g} {f.unit or ''}"
            )
            typer.echo(
                f"  fact {f.resource}{'' if f.component is None else f' component[{f.component}]'}: "
                f"{f.category} {what}{value} {f.effective or 'undated'} {f.status or ''}".rstrip()
            )
            if f.converted is not None and f.converted.rule != "same unit":
                typer.echo(f"    converted: {f.converted.value:g} {f.converted.unit} ({f.converted.rule})")
            if f.conversion_problem:
                typer.echo(f"    not converted: {f.conversion_problem}")
        for p in rec.problems:
            typer.echo(f"  problem {p}")
    for p in result.problems:
        typer.echo(f"problem {p}")
    if result.skipped_types:
        typer.echo(
            "skipped (types not read): "
            + ", ".join(f"{k} {v}" for k, v in sorted(result.skipped_types.items()))
        )
    typer.echo(f"{len(result.records)} patients from {result.kind} source")
    if out is not None:
        write_records(result.records, out)
        typer.echo(f"wrote {len(result.records)} records to {out}")


def write_records(records: list[FhirPatientRecord], out: Path) -> None:
    """One record per line (format verdict.fhir_patient/v1): what `verdict match batch --patients` reads."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for rec in records:
            fh.write(rec.model_dump_json() + "\n")


def screenable(result: LoadResult, say: Callable[[str], None], prefix: str) -> list[FhirPatientRecord]:
    """The records a screen can take (those with a document for the value miner); every problem, and
    each record left out, said by row or resource id (never content)."""
    for problem in result.problems:
        say(f"{prefix}: {problem}")
    kept = []
    for rec in result.records:
        for problem in rec.problems:
            say(f"{prefix}: {problem}")
        if rec.documents:
            kept.append(rec)
        else:
            say(f"{prefix}: {rec.patient_ref}: no document for the value miner; not screened")
    return kept
