"""`verdict bench ...` commands. Keep module-level imports light: heavy stacks load inside commands."""

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="bench commands", no_args_is_help=True)


@app.command()
def core(
    directory: Optional[Path] = typer.Argument(None, help="reference corpus (default ../shared/data/reference/v6)"),
    policy: str = typer.Option("prescreen", help="policy name or YAML path"),
    repeats: int = typer.Option(3, help="timed runs per pair for cold and warm"),
    naive: bool = typer.Option(True, help="also time the naive baseline"),
) -> None:
    """Latency of the decision engine's full artifact set, cold and warm, against a naive baseline."""
    from verdict_core.configs import REPO_ROOT
    from verdict_core.errors import VerdictError
    from verdict_core.policy import load_policy

    from .core_latency import report, run

    folder = directory or (REPO_ROOT.parent / "shared" / "data" / "reference" / "v6")
    try:
        result = run(folder, load_policy(policy), repeats=repeats, naive=naive, progress=typer.echo)
    except (VerdictError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    for line in report(result):
        typer.echo(line)
