"""`verdict fhir ...` commands. Module-level imports stay light (typer only)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import typer
from verdict.core.cli_errors import fail

app = typer.Typer(
    help="Patients from FHIR R4 (bundle, Bulk Data NDJSON, REST).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """Patients from FHIR R4 (bundle, Bulk Data NDJSON, REST)."""


@app.command()
def load(
    source: str = typer.Argument(
        ..., help="a Bundle .json file, a Bulk Data NDJSON folder, or an http(s) base URL"
    ),
    at: str = typer.Option(..., "--at", help="reference date YYYY-MM-DD: ages are computed at it"),
    patient: str | None = typer.Option(None, "--patient", help="only this Patient id"),
    out: Path | None = typer.Option(None, "--out", help="write the records as JSONL here"),
    codes: str = typer.Option("codes", "--codes", help="code map: name in configs/fhir or a YAML path"),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="REST client config YAML (FhirRestConfig: paging, timeouts, `smart:` SMART Backend "
        "Services); its base_url is SOURCE",
    ),
) -> None:
    """Read patients from FHIR and print, per patient: documents, facts, conversions, problems."""

    from .code_map import load_code_map
    from .rest import load_rest_config
    from .sources import load_source

    try:
        day = dt.date.fromisoformat(at)
    except ValueError:
        fail(f"--at: '{at}' is not a date YYYY-MM-DD")
    rest = load_rest_config(config, source) if config is not None else None
    result = load_source(source, day, patient=patient, code_map=load_code_map(codes), rest=rest)
    for rec in result.records:
        age = (
            rec.age_years
            if rec.age_years is not None
            else (f"{rec.age_range[0]}-{rec.age_range[1]}" if rec.age_range else "unknown")
        )
        typer.echo(
            f"Patient/{rec.patient_id}: age {age} at {rec.reference_date}, gender {rec.gender or 'unknown'}; "
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
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as fh:
            for rec in result.records:
                fh.write(rec.model_dump_json() + "\n")
        typer.echo(f"wrote {len(result.records)} records to {out}")


@app.command("smart-jwks")
def smart_jwks(
    key: Path = typer.Option(..., "--key", help="the client's PEM private key file (mode 0600)"),
    key_id: str = typer.Option(..., "--kid", help="the key id the assertions name (smart.key_id)"),
    algorithm: str = typer.Option("RS384", "--alg", help="RS384 (RSA key) or ES384 (EC P-384 key)"),
) -> None:
    """Print the public JWKS to register for this SMART Backend Services client (no private part)."""
    import json

    from .smart import public_jwks

    if algorithm not in ("RS384", "ES384"):
        fail(f"--alg: '{algorithm}' is not RS384 or ES384")
    typer.echo(json.dumps(public_jwks(key, key_id, algorithm), indent=2))  # a refused key: `error: ...`
