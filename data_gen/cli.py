"""`verdict teacher ...` commands. Keep module-level imports light: heavy stacks load inside commands."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import typer
from verdict.core.cli_errors import fail, guarded

app = typer.Typer(help="teacher commands", no_args_is_help=True, pretty_exceptions_enable=False)

EXIT_BUDGET = 3  # the run stopped cleanly at its budget (not an error: raise the budget to go on)


def _logging(verbose: bool) -> None:
    import logging

    # stderr shows warnings (or INFO with -v); the run's own log file gets INFO either way.
    logger = logging.getLogger("verdict.data_gen")
    for old in [h for h in logger.handlers if getattr(h, "_verdict_cli", False)]:
        logger.removeHandler(old)
    h = logging.StreamHandler()
    h._verdict_cli = True  # type: ignore[attr-defined]
    h.setLevel(logging.INFO if verbose else logging.WARNING)
    h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(h)


@app.command()
def run(
    config: str = typer.Option(
        ..., "--config", "-c", help="run config: name in configs/teacher_runs or a YAML path"
    ),
    budget_usd: float | None = typer.Option(
        None, "--budget-usd", help="stop before spending more than this (whole run)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="estimate tokens and cost; send nothing"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar on stderr"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log each stage result (ids only) to stderr"),
    set_: list[str] | None = typer.Option(
        None, "--set", help="override a run config key, e.g. --set trials.limit=5 (repeatable)"
    ),
) -> None:
    """Run the teachers over a run config's trials and patients (resumable: re-run to continue)."""
    import asyncio

    from .runner import TeacherRun
    from .teacher_config import load_run_config

    _logging(verbose)
    if budget_usd is not None and budget_usd < 0:
        fail("--budget-usd must be >= 0")
    cfg = load_run_config(config, set_)
    runner = TeacherRun(cfg, budget_usd=budget_usd, progress_bar=progress)
    if dry_run:
        _print_estimate(runner.dry_run())
        return
    s = guarded(
        lambda: asyncio.run(runner.run()),
        interrupted="everything answered so far is kept: run the same command to resume",
    )
    typer.echo(
        f"run {s.run}: {s.status}: {s.records_total} records in all; this session: "
        f"{s.accepted} accepted, {s.rejected} rejected, {s.failed} failed, "
        f"{s.calls_paid} calls paid (${s.cost_usd:.4f}), {s.cache_hits} cache hits; "
        f"${s.spent_total_usd:.4f} spent by this run in all; {s.elapsed_s:.1f} s"
    )
    if s.lost_in_flight:
        typer.echo(
            f"note: {s.lost_in_flight} call(s) were in flight when the run last stopped; their answers "
            "never arrived",
            err=True,
        )
    if s.message:
        typer.echo(s.message, err=True)
    if s.status == "stopped_budget":
        raise typer.Exit(EXIT_BUDGET)
    if s.status != "complete":
        raise typer.Exit(1)


def _print_estimate(est: dict) -> None:
    typer.echo(f"dry run {est['run']}: nothing was sent")
    for p in est["problems"][:20]:
        typer.echo(f"  input problem: {p}", err=True)
    rows = list(est["stages"].items()) + [("total", est["total"])]
    typer.echo(
        f"  {'stage':16s} {'items':>6s} {'cached':>6s} {'calls':>6s} {'prompt tok':>11s} "
        f"{'max out tok':>11s} {'max $':>10s}"
    )
    for stage, e in rows:
        typer.echo(
            f"  {stage:16s} {e['items']:6d} {e['cached_calls']:6d} {e['calls']:6d} {e['prompt_tokens']:11d} "
            f"{e['max_completion_tokens']:11d} {e['max_cost_usd']:10.4f}"
        )
    guessed = est["total"]["estimated_from_criteria"]
    if guessed:
        typer.echo(
            f"  ({guessed} value-miner calls estimated from criteria text: their trials are not parsed yet; "
            "calls that fail validation add one repair call each)"
        )
    if est["budget_usd"] is not None:
        typer.echo(f"  budget: ${est['budget_usd']:.4f}")


# Set by the `verdict` app (verdict/cli.py): the old `--from-reviews` spelling of
# `verdict serve export-reviews` still runs it, without this part importing serve.
MOVED_REVIEW_EXPORT: Callable[..., None] | None = None


@app.command()
def export(
    runs: list[str] = typer.Argument(None, help="run folders (runs/NAME) or run names"),
    out: str = typer.Option(..., "--out", "-o", help="output folder: one subfolder per task"),
    from_reviews: str = typer.Option(
        None,
        "--from-reviews",
        metavar="AUDIT_DB",
        help="moved: `verdict serve export-reviews AUDIT_DB` (this old spelling still runs it)",
    ),
    serve_config: str = typer.Option(
        None,
        help="with --from-reviews: serve config whose api.formalizer "
        "limits plan the miner calls (default: the service defaults)",
    ),
    seed: int = typer.Option(0, help="seed of the split shuffle"),
    split: str = typer.Option("0.8,0.1,0.1", help="train,validation,test fractions"),
    split_by: str = typer.Option("trial", help="trial | trial+patient (also keep each patient in one split)"),
    tasks: str = typer.Option(
        "parser,value_miner",
        help="comma-separated tasks: parser, value_miner, reader (the chart reader: a dataset the "
        "value-miner adapter trains on)",
    ),
    overwrite: bool = typer.Option(False, help="replace existing task folders"),
    runs_dir: Path = typer.Option(Path("runs"), help="where run names are looked up"),
) -> None:
    """Write SFT datasets (DatasetDict + JSONL + dataset card) from the accepted records of runs, or with
    --from-reviews from the reviews in a service's audit store (private site records)."""

    from .export import export_datasets
    from .stats import find_run

    try:
        fractions = tuple(float(x) for x in split.split(","))
        if len(fractions) != 3:
            raise ValueError
    except ValueError:
        fail(f"--split needs three comma-separated fractions, e.g. 0.8,0.1,0.1 (got '{split}')")
    if from_reviews:
        if runs:
            fail("give run folders or --from-reviews, not both")
        # The reviews are the service's: the command moved to serve (data_gen never imports serve);
        # the `verdict` app hands its implementation in as MOVED_REVIEW_EXPORT.
        typer.echo(
            "note: `verdict teacher export --from-reviews` moved to `verdict serve export-reviews`", err=True
        )
        if MOVED_REVIEW_EXPORT is None:
            fail("run `verdict serve export-reviews AUDIT_DB --out OUT` instead")
        return MOVED_REVIEW_EXPORT(from_reviews, out, serve_config, seed, fractions, overwrite)
    if not runs:
        fail("give one or more run folders (or --from-reviews AUDIT_DB)")
    out = Path(out)  # type: ignore[assignment]
    dirs = [find_run(r, runs_dir) for r in runs]
    cards = export_datasets(
        dirs,
        out,
        seed=seed,
        fractions=fractions,
        split_by=split_by,  # type: ignore[arg-type]
        tasks=tuple(t.strip() for t in tasks.split(",") if t.strip()),
        overwrite=overwrite,
    )
    print_cards(
        out,
        cards,
        lambda card: f"rejected {card['records']['rejected']} of {card['records']['total']} records",
    )


def print_cards(out: str | Path, cards: dict, detail) -> None:
    """One line per exported task: its folder, split sizes, and `detail(card)` in brackets."""
    for task, card in cards.items():
        c = card["counts"]
        typer.echo(
            f"{Path(out) / task}: train {c['train']}, validation {c['validation']}, test {c['test']} "
            f"({detail(card)})"
        )


@app.command()
def stats(
    run: str = typer.Argument(..., help="run folder (runs/NAME) or run name"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    runs_dir: Path = typer.Option(Path("runs"), help="where run names are looked up"),
) -> None:
    """Summarize a run: calls, cache hits, rejected outputs by reason, tokens, cost."""

    from .stats import find_run, render_stats, run_stats

    s = run_stats(find_run(run, runs_dir))
    typer.echo(json.dumps(s, indent=2, sort_keys=True) if as_json else render_stats(s))


@app.command("import-recorded")
def import_recorded(
    reference: Path = typer.Option(
        Path("../shared/data/reference/v6"), help="folder of <patient>/<trial>__full.json"
    ),
    patients: Path = typer.Option(
        Path("../shared/data/benchmarks/patients_sigir.jsonl"), help="the notes (JSONL)"
    ),
    out_dir: Path = typer.Option(Path("runs"), help="runs folder"),
    name: str = typer.Option("recorded-v6", help="run name for the imported records"),
    prompt_version: str = typer.Option(
        "v2", help="value-miner prompt version to pair the records with (v2: sparse targets)"
    ),
    trials: list[Path] = typer.Option(
        [
            Path("../shared/data/benchmarks/trials.jsonl"),
            Path("../shared/data/benchmarks/trials_judged0_only.jsonl"),
        ],
        "--trials",
        help="trial files with the criteria text the parser records are aligned with (repeatable)",
    ),
    parser_prompt_version: str = typer.Option(
        "v1", help="criterion-parser prompt version of the parser records"
    ),
) -> None:
    """Import the paper authors' recorded outputs as per-criterion parser records and value-miner
    records (no API calls)."""

    from .recorded import import_recorded as run_import

    s = run_import(
        reference,
        patients,
        out_dir,
        name,
        prompt_version,
        trials_path=[p for p in trials if p.exists()],
        parser_prompt_version=parser_prompt_version,
    )
    typer.echo(
        f"{s.run_dir}: {s.files} reference files -> {s.accepted} accepted, {s.rejected} rejected value-miner "
        f"records"
        + (f" (reasons: {', '.join(f'{k} {v}' for k, v in s.reasons.items())})" if s.reasons else "")
    )
    typer.echo(
        f"reader: {s.reader_accepted} accepted, {s.reader_rejected} rejected records (one per note: "
        "its recorded quotes as excerpts; task reader, trained into the value-miner adapter)"
    )
    typer.echo(
        f"parser: {s.parser_accepted} accepted, {s.parser_rejected} rejected per-criterion records"
        + (
            f" (reasons: {', '.join(f'{k} {v}' for k, v in s.parser_reasons.items())})"
            if s.parser_reasons
            else ""
        )
        + f"; {s.requirements} recorded requirements, {s.requirements_unaligned} not aligned with a "
        f"criterion, {s.criteria_without_requirement} criteria without a requirement, "
        f"{s.no_trial_text} files without "
        f"trial text (alignment: {', '.join(f'{k} {v}' for k, v in sorted(s.alignment.items())) or '-'})"
    )
    missing = [str(p) for p in trials if not p.exists()]
    if missing:
        typer.echo(
            f"  note: trial files not found, no parser records from them: {', '.join(missing)}", err=True
        )
    for p in s.problems[:20]:
        typer.echo(f"  problem: {p}", err=True)


@app.command("budget")
def budget(
    trials: list[Path] | None = typer.Option(
        None,
        "--trials",
        help="trials JSONL (default: the shared trials.jsonl "
        "+ trials_judged0_only.jsonl); parser prompts per criterion",
    ),
    notes: list[Path] | None = typer.Option(
        None,
        "--notes",
        help="patients JSONL whose notes make the long records (default: the SIGIR + TREC patients)",
    ),
    recorded: Path | None = typer.Option(
        None,
        "--recorded",
        help="recorded outputs <patient>/<trial>__full.json (default: ../shared/data/reference/v6)",
    ),
    recorded_notes: Path | None = typer.Option(
        None, "--recorded-notes", help="the recorded corpus' notes (default: the SIGIR patients)"
    ),
    limits: str = typer.Option("paper", "--limits", help="configs/limits/NAME.yaml (or a path)"),
    note_tokens: str = typer.Option(
        "500,2000,8000", "--note-tokens", help="sizes of the long records (tokens); empty: none"
    ),
) -> None:
    """Do the stage calls fit a student's limits? Prompt and completion tokens per stage (real
    tokenizer), and the share that fits; the last line sums up the recorded corpus."""

    from .budget_report import budget_report, format_report

    try:
        sizes = tuple(int(x) for x in note_tokens.split(",") if x.strip())
    except ValueError:
        fail(f"--note-tokens must be comma-separated integers (got '{note_tokens}')")
    report = budget_report(trials or None, notes or None, recorded, recorded_notes, limits, sizes)
    typer.echo(format_report(report))


@app.command()
def criteria(
    trials: list[Path] = typer.Option(
        [
            Path("../shared/data/benchmarks/trials.jsonl"),
            Path("../shared/data/benchmarks/trials_judged0_only.jsonl"),
        ],
        "--trials",
        help="trial files (JSONL or ctgov); repeat the option for several",
    ),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    top: int = typer.Option(10, help="how many of the most repeated criteria to list"),
    recorded: Path | None = typer.Option(
        None,
        help="also assemble the recorded programs of this reference "
        "folder per requirement and count merges (e.g. ../shared/data/reference/v6)",
    ),
) -> None:
    """Split every trial into criteria; print distinct criteria and the share of parser calls the
    criterion cache saves."""
    from verdict.core.errors import VerdictError

    from .stats import criteria_figures, render_criteria_figures

    try:
        f = criteria_figures(trials, top=top)
        if recorded is not None:
            from .recorded import assembly_figures

            f["assembly"] = assembly_figures(recorded)
    except (VerdictError, OSError) as e:
        fail(str(e))
    for p in f["problems"][:20]:
        typer.echo(f"  input problem: {p}", err=True)
    if as_json:
        typer.echo(json.dumps(f, indent=2))
        return
    typer.echo(render_criteria_figures(f))
    if "assembly" in f:
        a = f["assembly"]
        typer.echo(
            f"assembly: files={a['files']} assembled={a['assembled']} requirements={a['requirements']} "
            f"atom_declarations={a['atom_declarations']} atoms={a['atoms']} merged={a['merged']} "
            f"renamed={a['renamed']} near_duplicates={a['near_duplicates']} refused={a['refused']}"
        )


@app.command("scripted-server")
def scripted_server(
    script: Path | None = typer.Option(
        None, help="YAML/JSON script (default: answer value-miner calls with nulls)"
    ),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(0, help="0 = a free port"),
    latency: float | None = typer.Option(None, help="fixed per-call latency (s)"),
    set_: list[str] | None = typer.Option(
        None, "--set", help="override a script key, e.g. --set default_latency_s=0.5 (repeatable)"
    ),
) -> None:
    """Serve the scripted OpenAI-compatible test server (offline demos and tests)."""
    from .scripted_server import main

    args = ["--host", host, "--port", str(port)] + [f"--set={s}" for s in set_ or []]
    if script:
        args += ["--script", str(script)]
    if latency is not None:
        args += ["--latency", str(latency)]
    main(args)
