"""The `verdict` command: core subcommands here, one sub-app per part of the project.

Parts register by module path and are imported lazily-light (their cli modules import only typer
at module level), so `verdict decide` never pays for torch or vLLM. A part whose dependencies are
missing never vanishes: it stays listed as UNAVAILABLE, and using it - or a command reaching a
missing module later, at run time - is one `error:` line naming the missing package and the extra
that installs it (or, for a module no extra declares, saying that the environment is broken).
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from .cli_errors import fail, guarded
from .errors import VerdictError

app = typer.Typer(
    help="Verdict on-site: accountable clinical-trial eligibility matching on your own hardware.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)

# name -> ("module:attribute" of a typer app, help, the extra that installs its dependencies).
PARTS = {
    "teacher": ("data_gen.cli:app", "Teacher pipeline: API formalizer outputs -> checked SFT datasets.",
                "teacher"),
    "train": ("train.cli:app", "LoRA distillation of the parser and value-miner students.", "train"),
    "slurm": ("slurm.cli:app", "Render and submit SLURM jobs for train / eval / serve.", "slurm"),
    "serve": ("serve.cli:app", "vLLM students + the FastAPI matching service.", "serve"),
    "match": ("serve.match_cli:app", "Batch matching (site-wide screening as SLURM arrays).", "serve"),
    "fhir": ("data_gen.fhir.cli:app", "Patients from FHIR R4: bundle, Bulk Data NDJSON, REST server.", "fhir"),
    "bench": ("bench.cli:app", "Benchmarks: core latency, local vs API formalizers.", "bench"),
}
# name -> ("module:function", extra) of single commands that live in a part.
COMMANDS = {
    "demo": ("serve.demo:demo", "all"),  # the main job: the whole on-site story on bundled sample data
    "screen": ("serve.screen.cli:screen", "serve"),  # a ranked screen from the running service
}
DISTRIBUTION = "verdict-onsite"
# Requirement names whose import name is not the name itself (lower case, '-' -> '_').
_IMPORT_NAMES = {"pyyaml": "yaml", "z3-solver": "z3", "python-multipart": "multipart", "fhir.resources": "fhir"}


def _requirements() -> list[tuple[str, str | None]]:
    """(requirement name, extra or None) of the installed distribution; [] when not installed."""
    from importlib import metadata

    try:
        reqs = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for r in reqs:
        name = re.match(r"[A-Za-z0-9._-]+(\[[^\]]*\])?", r.strip()).group(0)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", r)
        out.append((name, extra.group(1) if extra else None))
    return out


def extra_modules(extra: str) -> dict[str, str]:
    """import name -> requirement name of everything ``extra`` installs (nested extras included)."""
    reqs, out, todo, seen = _requirements(), {}, [extra], set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for name, ex in reqs:
            if ex != e:
                continue
            base, _, nested = name.partition("[")
            if base.lower() == DISTRIBUTION:
                todo += [x.strip() for x in nested.rstrip("]").split(",") if x.strip()]
                continue
            out[_IMPORT_NAMES.get(base.lower(), base.lower().replace("-", "_"))] = base
    return out


def missing_dependency(e: ModuleNotFoundError, command: str, extra: str) -> str:
    """What a missing module means for ``verdict COMMAND``. A module that one of the command's
    extras declares: the extra is not installed (say which to install). Anything else - a project
    module, or a package no extra declares (a dependency of a dependency) - is a broken install."""
    missing = e.name or str(e)
    top = missing.split(".")[0]
    command = f"verdict {command}".strip()
    declared = extra_modules(extra)
    if top in declared:
        return (f"`{command}` needs the '{extra}' extra: package '{declared[top]}' (module '{top}') is not "
                f"installed; install it with: pip install '{DISTRIBUTION}[{extra}]'")
    what = "a module of this project" if top in {t.split(".")[0] for t, *_ in PARTS.values()} | {
        "verdict_core"} else "a package none of the project's extras declares (a dependency of a dependency)"
    return (f"`{command}` cannot load: module '{missing}' is missing, {what}: the environment is "
            "broken; reinstall it (e.g. scripts/setup.sh)")


def _unavailable(name: str, message: str, help_text: str) -> None:
    """A stand-in for a part that cannot load: listed in --help, and its use is an error that says why."""

    @app.command(name, help=f"UNAVAILABLE ({message}). {help_text}", add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def _stand_in(ctx: typer.Context) -> None:
        fail(message)


def _mount_parts() -> None:
    for name, (target, help_text, extra) in PARTS.items():
        module, attr = target.split(":")
        try:
            sub = getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as e:
            _unavailable(name, missing_dependency(e, name, extra), help_text)
            continue
        app.add_typer(sub, name=name, help=help_text)
    for name, (target, extra) in COMMANDS.items():
        module, attr = target.split(":")
        try:
            app.command(name)(getattr(importlib.import_module(module), attr))
        except ModuleNotFoundError as e:
            _unavailable(name, missing_dependency(e, name, extra), "")


def _extra_of(argv: list[str]) -> tuple[str, str]:
    """(command, extra) of the command line: the first argument naming a part or command."""
    for a in argv:
        if a in PARTS:
            return a, PARTS[a][2]
        if a in COMMANDS:
            return a, COMMANDS[a][1]
    return "", "all"


@app.command()
def decide(
    files: list[Path] = typer.Argument(..., help="program+patient case files, or reference-format files"),
    policy: str = typer.Option("prescreen", help="policy name (configs/policies) or YAML path"),
    format: str = typer.Option("json", "--format", "-f", help="json (one object per line) | md | full-json"),
    alternatives: int = typer.Option(2, help="extra minimum pivotal sets to enumerate (0 = none)"),
    timeout_ms: int = typer.Option(5000, help="time limit per solver call"),
    summary: bool = typer.Option(False, "--summary", help="print counts (decided, errors by kind, conflicts by "
                                 "source) to stderr at the end"),
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
            out = json.dumps(error, sort_keys=True) if format != "md" else (
                f"## {path}: **ERROR** ({error['error']})\n\n{error['message']}"
                + "".join(f"\n- {p}" for p in error["problems"]))
        typer.echo(out)
    if summary:
        decided = counts["decided"]
        typer.echo(f"files {len(files)}, decided {sum(decided.values())} ({_counts(decided)}), errors {failed}"
                   f" ({_counts(counts['errors'])}), conflicts reported {sum(counts['conflicts'].values())}"
                   f" ({_counts(counts['conflicts'])})", err=True)
    raise typer.Exit(1 if failed else 0)


def _counts(c: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"


def _decide_file(engine, pol, path: Path, format: str, counts: dict[str, Counter]) -> tuple[str | None, dict | None]:
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
        return error("InternalError", f"unexpected {type(e).__name__} (a defect in verdict; please report it)")
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
        guarded(app)  # the one error path of every command: `error: ...`, exit 2, no traceback
    except typer.Exit as e:  # raised by `fail` once the command has left click's hands
        sys.exit(e.exit_code)
    except ModuleNotFoundError as e:  # a lazy import inside a command: which package, which extra
        command, extra = _extra_of(sys.argv[1:])
        typer.echo(f"error: {missing_dependency(e, command, extra)}", err=True)
        sys.exit(2)
