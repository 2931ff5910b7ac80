"""The `verdict` command: the top of the stack. It adds the core's commands (`verdict.core.cli`) and
one sub-app per part of the project, each imported explicitly below.

Each part's cli module imports only typer at module level, so `verdict decide` never pays for torch
or vLLM. A part whose dependencies are missing never vanishes: it stays listed as UNAVAILABLE, and
using it - or a command reaching a missing module later, at run time - is one `error:` line naming
the missing package and the extra that installs it (or, for a module no extra declares, saying that
the environment is broken).

`--config-dir DIR` (or `VERDICT_CONFIG_DIR`) names a site's own configs folder: its
`KIND/NAME.yaml` files are found before the shipped ones (`verdict.core.configs`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from verdict.core import cli as core_cli
from verdict.core.cli_errors import fail, guarded

app = typer.Typer(
    help="Verdict on-site: accountable clinical-trial eligibility matching on your own hardware.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.registered_commands += core_cli.app.registered_commands  # decide, schema, policies, samples


def version_text() -> str:
    """`verdict-onsite X.Y.Z`, and the code version training runs record (`git describe` of a checkout)."""
    from importlib import metadata

    from verdict.train.run_dir import code_version

    try:
        text = f"{DISTRIBUTION} {metadata.version(DISTRIBUTION)}"
    except metadata.PackageNotFoundError:
        text = f"{DISTRIBUTION} (not installed)"
    return f"{text} ({code_version()})"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _options(
    config_dir: Path | None = typer.Option(
        None,
        "--config-dir",
        envvar="VERDICT_CONFIG_DIR",
        help="a site's configs folder (KIND/NAME.yaml), searched before the shipped configs",
    ),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="print the installed version and exit",
    ),
) -> None:
    if config_dir is not None:
        if not config_dir.is_dir():
            fail(f"--config-dir '{config_dir}' is not a folder")
        # the environment carries it to every config lookup, and to the jobs and servers started from here
        os.environ["VERDICT_CONFIG_DIR"] = str(config_dir.resolve())


# Each part's typer app, imported where it is used (a part's missing dependency is its own error).
def _teacher() -> typer.Typer:
    from verdict.data_gen import cli as teacher_cli

    def moved_review_export(*args) -> None:  # `teacher export --from-reviews` moved to serve
        from verdict.serve.reviews.cli import export_reviews_to

        export_reviews_to(*args)

    teacher_cli.MOVED_REVIEW_EXPORT = moved_review_export
    return teacher_cli.app


def _train() -> typer.Typer:
    from verdict.train.cli import app as part

    return part


def _slurm() -> typer.Typer:
    from verdict.slurm.cli import app as part

    return part


def _serve() -> typer.Typer:
    from verdict.serve.cli import app as part

    return part


def _match() -> typer.Typer:
    from verdict.serve.batch.cli import app as part

    return part


def _fhir() -> typer.Typer:
    from verdict.data_gen.fhir.cli import app as part

    return part


def _omop() -> typer.Typer:
    from verdict.data_gen.omop.cli import app as part

    return part


def _bench() -> typer.Typer:
    from verdict.bench.cli import app as part

    return part


def _demo() -> Callable:
    from verdict.demo import demo

    return demo


def _screen() -> Callable:
    from verdict.serve.screen.cli import screen

    return screen


# name -> (loader of its typer app, help, the extra that installs its dependencies).
PARTS: dict[str, tuple[Callable[[], typer.Typer], str, str]] = {
    "teacher": (_teacher, "Teacher pipeline: API formalizer outputs -> checked SFT datasets.", "teacher"),
    "train": (_train, "LoRA distillation of the parser and value-miner students.", "train"),
    "slurm": (_slurm, "Render and submit SLURM jobs for train / eval / serve.", "slurm"),
    "serve": (_serve, "vLLM students + the FastAPI matching service.", "serve"),
    "match": (_match, "Batch matching (site-wide screening as SLURM arrays).", "serve"),
    "fhir": (_fhir, "Patients from FHIR R4: bundle, Bulk Data NDJSON, REST server.", "fhir"),
    "omop": (_omop, "Patients from an OMOP CDM 5.4 database (PostgreSQL).", "serve"),
    "bench": (_bench, "Benchmarks: core latency, local vs API formalizers.", "bench"),
}
# name -> (loader of the function, extra) of single commands that live in a part.
COMMANDS: dict[str, tuple[Callable[[], Callable], str]] = {
    "demo": (_demo, "all"),  # the main job: the whole on-site story on bundled sample data
    "screen": (_screen, "serve"),  # a ranked screen from the running service
}
DISTRIBUTION = "verdict-onsite"
# Requirement names whose import name is not the name itself (lower case, '-' -> '_').
_IMPORT_NAMES = {
    "pyyaml": "yaml",
    "z3-solver": "z3",
    "python-multipart": "multipart",
    "fhir.resources": "fhir",
}


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
        return (
            f"`{command}` needs the '{extra}' extra: package '{declared[top]}' (module '{top}') is not "
            f"installed; install it with: pip install '{DISTRIBUTION}[{extra}]'"
        )
    # a dependency of a dependency, reached first while the extra itself is not installed
    absent = sorted(req for mod, req in declared.items() if importlib.util.find_spec(mod) is None)
    if absent:
        return (
            f"`{command}` needs the '{extra}' extra (module '{missing}' is missing, and the extra's "
            f"{', '.join(repr(a) for a in absent[:4])}{' ...' if len(absent) > 4 else ''} not installed); "
            f"install it with: pip install '{DISTRIBUTION}[{extra}]'"
        )
    what = (
        "a module of this project"
        if top == "verdict"
        else "a package none of the project's extras declares (a dependency of a dependency)"
    )
    return (
        f"`{command}` cannot load: module '{missing}' is missing, {what}: the environment is "
        "broken; reinstall it (e.g. scripts/setup.sh)"
    )


def _unavailable(name: str, message: str, help_text: str) -> None:
    """A stand-in for a part that cannot load: listed in --help, and its use is an error that says why."""

    @app.command(
        name,
        help=f"UNAVAILABLE ({message}). {help_text}",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def _stand_in(ctx: typer.Context) -> None:
        fail(message)


def _mount_parts() -> None:
    for name, (load, help_text, extra) in PARTS.items():
        try:
            sub = load()
        except ModuleNotFoundError as e:
            _unavailable(name, missing_dependency(e, name, extra), help_text)
            continue
        app.add_typer(sub, name=name, help=help_text)
    for name, (load, extra) in COMMANDS.items():
        try:
            app.command(name)(load())
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
