"""`verdict serve export-reviews`: SFT datasets from the reviews in a service's audit store.

The reviews belong to the service (serve/), so their export lives here; `verdict teacher export
--from-reviews`, its old name, still works and says that it moved (the `verdict` app wires it,
so data_gen never imports serve).

Imports inside the commands: a part's cli module imports only typer (and light modules) at module
level, so that `verdict --help` and the other parts' commands never load this part's heavy optional
dependencies (fastapi, vLLM, httpx, psycopg, jinja2: the serve and slurm extras; verdict/cli.py).
"""

from __future__ import annotations

from pathlib import Path

import typer
from verdict.core.cli_errors import fail


def export_reviews_command(
    audit_db: str = typer.Argument(..., metavar="AUDIT_DB", help="sqlite path or postgresql:// URL"),
    out: str = typer.Option(..., "--out", "-o", help="output folder: one subfolder per task"),
    serve_config: str = typer.Option(
        None,
        help="serve config whose api.formalizer limits plan the miner calls (default: the service defaults)",
    ),
    seed: int = typer.Option(0, help="seed of the split shuffle"),
    split: str = typer.Option("0.8,0.1,0.1", help="train,validation,test fractions"),
    overwrite: bool = typer.Option(False, help="replace existing task folders"),
) -> None:
    """Write SFT datasets from the reviews in a service's audit store (private site records)."""
    export_reviews_to(audit_db, out, serve_config, seed, split_fractions(split), overwrite)


def split_fractions(split: str) -> tuple[float, float, float]:
    try:
        fractions = tuple(float(x) for x in split.split(","))
        if len(fractions) == 3:
            return fractions  # type: ignore[return-value]
    except ValueError:
        pass
    fail(f"--split needs three comma-separated fractions, e.g. 0.8,0.1,0.1 (got '{split}')")


def export_reviews_to(
    audit_db: str,
    out: str,
    serve_config: str | None,
    seed: int,
    fractions: tuple[float, float, float],
    overwrite: bool,
) -> None:
    from verdict.data_gen.cli import print_cards

    from ..config import load_serve_config
    from .export import export_reviews

    limits = load_serve_config(serve_config).require("api").formalizer if serve_config else None
    cards, summary = export_reviews(
        audit_db, out, limits=limits, seed=seed, fractions=fractions, overwrite=overwrite
    )  # a str: an URL is refused, not collapsed to a path
    print_cards(Path(out), cards, lambda card: f"data class {card['data_class']}")
    for reason, ids in sorted(summary.skipped.items()):
        typer.echo(f"not exported ({reason}): {len(ids)}: {', '.join(ids)}")
