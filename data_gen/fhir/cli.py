"""`verdict fhir ...` commands, and the pieces every command reading patient records shares: the
`--at` reference date and a read that stops the command with its problem (`verdict omop load`,
`verdict screen`, `verdict match batch`). Module-level imports stay light (typer only)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from verdict.core.cli_errors import fail

if TYPE_CHECKING:
    from .sources import LoadResult

app = typer.Typer(
    help="Patients from FHIR R4 (bundle, Bulk Data NDJSON, REST).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def reference_date(at: str) -> dt.date:
    """The `--at` date a record source is read at; a malformed one stops the command."""
    try:
        return dt.date.fromisoformat(at)
    except ValueError:
        fail(f"--at: '{at}' is not a date YYYY-MM-DD")


def read_records(load: Callable[..., LoadResult], *args, **kwargs) -> LoadResult:
    """A source read (`load_source`, `load_omop`); a refused or failed one stops the command, saying why."""
    from verdict.core.errors import VerdictError

    try:
        return load(*args, **kwargs)
    except VerdictError as e:  # EgressRefused included: nothing was sent, no connection opened
        fail(str(e))


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
    from .show import show_result
    from .sources import load_source

    day = reference_date(at)
    rest = load_rest_config(config, source) if config is not None else None
    result = read_records(load_source, source, day, patient=patient, code_map=load_code_map(codes), rest=rest)
    show_result(result, out)


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
