"""The `verdict` command: core subcommands here, one sub-app per part of the project.

Parts register by module path and are imported lazily-light (their cli modules import only typer
at module level), so `verdict decide` never pays for torch or vLLM.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from .cli_errors import fail
from .errors import VerdictError

app = typer.Typer(
    help="Verdict on-site: accountable clinical-trial eligibility matching on your own hardware.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)

# name -> "module:attribute" of a typer app; each part owns its commands.
PARTS = {
    "teacher": ("data_gen.cli:app", "Teacher pipeline: API formalizer outputs -> checked SFT datasets."),
    "train": ("train.cli:app", "LoRA distillation of the parser and value-miner students."),
    "slurm": ("slurm.cli:app", "Render and submit SLURM jobs for train / eval / serve."),
    "serve": ("serve.cli:app", "vLLM students + the FastAPI matching service."),
    "match": ("serve.match_cli:app", "Batch matching (site-wide screening as SLURM arrays)."),
    "bench": ("bench.cli:app", "Benchmarks: core latency, local vs API formalizers."),
}
# name -> "module:function" of single commands that live in a part.
COMMANDS = {
    "demo": "serve.demo:demo",  # the main job: the whole on-site story on bundled sample data
}


def _mount_parts() -> None:
    for name, (target, help_text) in PARTS.items():
        module, attr = target.split(":")
        try:
            sub = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError:
            continue  # a part not present in this checkout
        app.add_typer(sub, name=name, help=help_text)
    for name, target in COMMANDS.items():
        module, attr = target.split(":")
        try:
            app.command(name)(getattr(importlib.import_module(module), attr))
        except ModuleNotFoundError:
            continue


@app.command()
def decide(
    files: list[Path] = typer.Argument(..., help="program+patient case files, or reference-format files"),
    policy: str = typer.Option("prescreen", help="policy name (configs/policies) or YAML path"),
    format: str = typer.Option("json", "--format", "-f", help="json (one object per line) | md | full-json"),
    alternatives: int = typer.Option(2, help="extra minimum pivotal sets to enumerate (0 = none)"),
    timeout_ms: int = typer.Option(5000, help="time limit per solver call"),
) -> None:
    """Decide eligibility for each FILE and print decision, assumptions and pivotal conditions."""
    from .cases import load_case
    from .engine import Engine
    from .policy import load_policy
    from .rationale import render_markdown, summary_json

    try:
        pol = load_policy(policy)
    except VerdictError as e:
        fail(str(e))
    if format not in ("json", "md", "full-json"):
        fail(f"--format must be json, md or full-json (got '{format}')")
    engine = Engine(timeout_ms=timeout_ms, alternatives=alternatives)
    status = 0
    for path in files:
        try:
            case = load_case(path)
            patient = case.patient_under(pol)
            d = engine.decide(case.program, patient)
        except VerdictError as e:
            typer.echo(f"error: {path}: {e}", err=True)
            status = 1
            continue
        except OSError as e:
            typer.echo(f"error: {path}: cannot read: {e.strerror}", err=True)
            status = 1
            continue
        if format == "md":
            typer.echo(render_markdown(case.program, patient, d))
        elif format == "full-json":
            typer.echo(d.canonical_json())
        else:
            typer.echo(json.dumps(summary_json(case.program, patient, d, source=str(path)), sort_keys=True))
    raise typer.Exit(status)


@app.command()
def schema(
    which: str = typer.Argument("all", help="program | parsed-trial | value-miner | patient | decision | policy | all"),
    out: Optional[Path] = typer.Option(None, help="write <name>.schema.json files into this folder"),
) -> None:
    """Print or write the JSON Schemas of the core's data models."""
    from .schemas import SCHEMAS, json_schema

    names = list(SCHEMAS) if which == "all" else [which]
    for n in names:
        if n not in SCHEMAS:
            fail(f"unknown schema '{n}' (known: {', '.join(SCHEMAS)})")
    for n in names:
        text = json.dumps(json_schema(n), indent=2, sort_keys=True)
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{n}.schema.json").write_text(text + "\n")
        else:
            typer.echo(text)


@app.command()
def policies() -> None:
    """List the policies found in configs/policies."""
    from .configs import available
    from .policy import load_policy

    for name in available("policies"):
        try:
            p = load_policy(name)
            typer.echo(f"{p.name} v{p.version}: {p.description}")
        except VerdictError as e:
            typer.echo(f"{name}: INVALID: {e.summary}")


@app.command()
def samples(
    cases_dir: Path = typer.Option(None, help="folder of sample cases (default: examples/cases)"),
    policy: str = typer.Option("prescreen"),
) -> None:
    """Decide the bundled sample cases with the core alone (no model) and print their rationales."""
    from .cases import load_case
    from .configs import REPO_ROOT
    from .engine import Engine
    from .policy import load_policy
    from .rationale import render_markdown

    folder = cases_dir or (REPO_ROOT / "examples" / "cases")
    files = sorted(folder.glob("*.json"))
    if not files:
        fail(f"no sample cases in {folder}")
    engine, pol = Engine(), load_policy(policy)
    for f in files:
        case = load_case(f)
        patient = case.patient_under(pol)
        typer.echo(render_markdown(case.program, patient, engine.decide(case.program, patient)))
        typer.echo("")


def main() -> None:
    _mount_parts()
    try:
        app()
    except VerdictError as e:  # any bad input that escaped a command: message, no traceback
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
