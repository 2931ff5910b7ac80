"""`verdict omop load`: read persons from an OMOP CDM 5.4 database and print what was read (no text).
The OMOP config of a command's flags (`omop_config`) is shared with `verdict screen --omop` and
`verdict match batch --omop`.

Imports inside the commands: a part's cli module imports only typer (and light modules) at module
level, so that `verdict --help` never loads psycopg (the serve extra; verdict/cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from verdict.core.cli_errors import fail

from ..fhir.cli import read_records, reference_date

if TYPE_CHECKING:
    from .config import OmopConfig

app = typer.Typer(
    help="Patients from an OMOP CDM 5.4 database (PostgreSQL).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def omop_config(url: str, config: Path | None, cohort: int | None, person_ids: Path | None) -> OmopConfig:
    """The OMOP config of a command's flags; a bad one stops the command with the problem."""
    from verdict.core.errors import VerdictError

    from .config import load_omop_config, read_person_ids

    try:
        ids = read_person_ids(person_ids) if person_ids is not None else None
        return load_omop_config(config, url, cohort_id=cohort, person_ids=ids)
    except VerdictError as e:
        fail(str(e))


@app.command()
def load(
    url: str = typer.Argument(
        ..., help="postgresql://USER@HOST[:PORT]/DB (no password: $VERDICT_OMOP_PASSWORD or PGPASSWORD)"
    ),
    at: str = typer.Option(..., "--at", help="reference date YYYY-MM-DD: ages are computed at it"),
    cohort: int | None = typer.Option(None, "--cohort", help="only the persons of this cohort"),
    person_ids: Path | None = typer.Option(
        None, "--person-ids", exists=True, dir_okay=False, help="only these person_ids (one per line)"
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        exists=True,
        dir_okay=False,
        help="OMOP config YAML (OmopConfig); URL is set over it",
    ),
    codes: str = typer.Option("codes", "--codes", help="code map: name in configs/fhir or a YAML path"),
    out: Path | None = typer.Option(None, "--out", help="write the records as JSONL here"),
) -> None:
    """Read persons from OMOP and print, per person: documents, facts, conversions, problems."""
    from ..fhir.code_map import load_code_map
    from ..fhir.show import show_result
    from .sources import load_omop

    cfg = omop_config(url, config, cohort, person_ids)
    show_result(read_records(load_omop, cfg, reference_date(at), load_code_map(codes)), out)
