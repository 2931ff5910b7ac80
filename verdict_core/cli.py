"""The core's own commands (`verdict decide`, `schema`, `policies`, `samples`): the Z3 decision
core alone, no model. The `verdict` application (`verdict/cli.py`) adds them beside the parts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer

from .cli_errors import fail
from .errors import VerdictError

app = typer.Typer(help="The decision core's commands.")


@app.command()
def decide(
    files: list[Path] = typer.Argument(..., help="program+patient case files, or reference-format files"),
    policy: str = typer.Option("prescreen", help="policy name (configs/policies) or YAML path"),
    format: str = typer.Option("json", "--format", "-f", help="json (one object per line) | md | full-json"),
    alternatives: int = typer.Option(2, help="extra minimum pivotal sets to enumerate (0 = none)"),
    timeout_ms: int = typer.Option(5000, help="time limit per solver call"),
    summary: bool = typer.Option(
        False,
        "--summary",
        help="print counts (decided, errors by kind, conflicts by source) to stderr at the end",
    ),
) -> None:
    """Decide eligibility for each FILE and print decision, assumptions and pivotal conditions.

    One output per FILE, in order: a file that cannot be decided gives an error object (json:
    ``{"source", "error", "message", "problems"}``) and never stops the others; the exit status is
    1 at the end if any file failed."""
    from .engine import Engine
    from .policy import load_policy

    pol = load_policy(policy)
    if format not in ("json", "md", "full-json"):
        fail(f"--format must be json, md or full-json (got '{format}')")
    engine = Engine(timeout_ms=timeout_ms, alternatives=alternatives)
    failed = 0
    counts: dict[str, Counter] = {"decided": Counter(), "errors": Counter(), "conflicts": Counter()}
    for path in files:
        out, error = _decide_file(engine, pol, path, format, counts)
        if error is not None:
            failed += 1
            counts["errors"][error["error"]] += 1
            typer.echo(f"error: {path}: {error['message']}", err=True)
            out = (
                json.dumps(error, sort_keys=True)
                if format != "md"
                else (
                    f"## {path}: **ERROR** ({error['error']})\n\n{error['message']}"
                    + "".join(f"\n- {p}" for p in error["problems"])
                )
            )
        typer.echo(out)
    if summary:
        decided = counts["decided"]
        typer.echo(
            f"files {len(files)}, decided {sum(decided.values())} ({_counts(decided)}), errors {failed}"
            f" ({_counts(counts['errors'])}), conflicts reported {sum(counts['conflicts'].values())}"
            f" ({_counts(counts['conflicts'])})",
            err=True,
        )
    raise typer.Exit(1 if failed else 0)


def _counts(c: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"


def _decide_file(
    engine, pol, path: Path, format: str, counts: dict[str, Counter]
) -> tuple[str | None, dict | None]:
    """(output text, None) or (None, error object) for one file; nothing raised."""
    from .cases import load_case
    from .rationale import render_markdown, summary_json

    def error(kind: str, message: str, problems: list[str] | None = None) -> tuple[None, dict]:
        message = message.removeprefix(f"{path.name}: ")  # the file is named once, in "source"
        return None, {"source": str(path), "error": kind, "message": message, "problems": problems or []}

    try:
        case = load_case(path)
        patient = case.patient_under(pol)
        d = engine.decide(case.program, patient)
    except VerdictError as e:
        return error(type(e).__name__, e.summary, e.problems)
    except OSError as e:
        return error("ReadError", f"cannot read: {e.strerror or e}")
    except RecursionError:
        return error("ImportFormatError", "nested too deeply to read")
    except Exception as e:  # a defect must not cost the other files their decisions
        return error(
            "InternalError", f"unexpected {type(e).__name__} (a defect in verdict; please report it)"
        )
    if case.conflicts:  # found while importing recorded values: reported like the engine's own
        d = d.model_copy(update={"conflicts": [*case.conflicts, *d.conflicts]})
    counts["decided"][d.decision] += 1
    counts["conflicts"].update(c.source for c in d.conflicts)
    if format == "md":
        text = render_markdown(case.program, patient, d)
        if case.import_notes:
            text += "\n\n### Import notes\n" + "\n".join(f"- {n}" for n in case.import_notes)
        return text, None
    if format == "full-json":
        return d.canonical_json(), None
    obj = summary_json(case.program, patient, d, source=str(path))
    obj["import_notes"] = case.import_notes
    return json.dumps(obj, sort_keys=True), None


@app.command()
def schema(
    which: str = typer.Argument(
        "all", help="program | parsed-trial | value-miner | patient | decision | policy | all"
    ),
    out: Path | None = typer.Option(None, help="write <name>.schema.json files into this folder"),
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
    cases_dir: Path = typer.Option(None, help="folder of sample cases (default: the bundled examples/cases)"),
    policy: str = typer.Option("prescreen"),
) -> None:
    """Decide the bundled sample cases with the core alone (no model) and print their rationales."""
    from .cases import load_case
    from .configs import shipped
    from .engine import Engine
    from .policy import load_policy
    from .rationale import render_markdown

    folder = cases_dir or shipped("examples", "cases")
    files = sorted(folder.glob("*.json"))
    if not files:
        fail(f"no sample cases in {folder}")
    engine, pol = Engine(), load_policy(policy)
    for f in files:
        case = load_case(f)
        patient = case.patient_under(pol)
        typer.echo(render_markdown(case.program, patient, engine.decide(case.program, patient)))
        typer.echo("")
