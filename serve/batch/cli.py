"""`verdict match ...`: site-wide screening from JSONL as a SLURM job array.

    verdict match batch --config SERVE --patients P.jsonl --trials T.jsonl --shards 8 --out runs/match/x \\
        --slurm configs/slurm/default.yaml --submit --wait
    verdict match status --out runs/match/x
    verdict match worker --out runs/match/x --shard 3        (what each array task runs)
    verdict match merge --out runs/match/x                   (what the merge job runs)

Keep module-level imports light: heavy stacks load inside commands.

Imports inside the commands: a part's cli module imports only typer (and light modules) at module
level, so that `verdict --help` and the other parts' commands never load this part's heavy optional
dependencies (fastapi, vLLM, httpx, psycopg, jinja2: the serve and slurm extras; verdict/cli.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from verdict.core.cli_errors import fail

app = typer.Typer(help="batch matching (site-wide screening as SLURM arrays)", no_args_is_help=True)


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command("batch")
def batch_cmd(
    config: str = typer.Option(..., "--config", "-c", help="serve config (its vllm and api sections)"),
    patients: Path | None = typer.Option(None, help="patients JSONL ({_id, text}); or --omop"),
    trials: Path = typer.Option(..., help="trials JSONL (benchmark layout) or ClinicalTrials.gov study JSON"),
    out: Path = typer.Option(..., help="batch folder (plan, shard results, merged results)"),
    pairs: Path | None = typer.Option(None, help="pairs JSONL ({patient_id, nct_id}); default: every pair"),
    policy: str = typer.Option("prescreen", help="policy name"),
    shards: int = typer.Option(1, min=1, help="array tasks: one vLLM + worker per GPU job"),
    slurm: str = typer.Option("default", help="slurm config (configs/slurm/NAME.yaml or a path)"),
    name: str | None = typer.Option(None, help="batch name (job names); default: the folder name"),
    set_: list[str] | None = typer.Option(
        None, "--set", help="serve config override, e.g. vllm.dtype=float32"
    ),
    slurm_set: list[str] | None = typer.Option(None, help="slurm config override"),
    submit: bool = typer.Option(True, help="submit the array and the merge job (else: only render them)"),
    wait: bool = typer.Option(False, help="wait for the jobs, showing progress, then print the summary"),
    timeout: float = typer.Option(24 * 3600, help="with --wait: give up after this many seconds"),
    omop: str | None = typer.Option(
        None, "--omop", help="patients from an OMOP CDM 5.4 database: postgresql://USER@HOST/DB (no password)"
    ),
    omop_config: Path | None = typer.Option(None, exists=True, dir_okay=False, help="OMOP config YAML"),
    omop_cohort: int | None = typer.Option(None, help="only the persons of this cohort"),
    omop_person_ids: Path | None = typer.Option(
        None, exists=True, dir_okay=False, help="only these person_ids (one per line)"
    ),
    at: str | None = typer.Option(None, "--at", help="with --omop: reference date YYYY-MM-DD (ages)"),
) -> None:
    """Plan a batch, render its SLURM array (+ merge job) and submit it. Rerunning the same command on
    the same folder resumes: finished pairs are never matched again."""
    from .match_batch import plan_batch, render_batch_jobs

    patients = batch_patients(patients, omop, omop_config, omop_cohort, omop_person_ids, at, out)
    plan = plan_batch(
        out,
        name=name or out.resolve().name,
        serve_config=config,
        patients=patients,
        trials=trials,
        pairs=pairs,
        policy=policy,
        shards=shards,
        overrides=set_ or [],
    )
    _say(
        f"batch '{plan.name}': {plan.counts['pairs']} pairs ({plan.counts['patients']} patients x "
        f"{plan.counts['trials']} trials) in {plan.shards} shard(s) -> {out}"
    )
    scripts = render_batch_jobs(out, slurm, slurm_set or [])
    for p in scripts.values():
        _say(f"rendered {p}")
    if submit:
        submit_batch(out, scripts, wait, timeout)


def batch_patients(
    patients: Path | None,
    omop: str | None,
    omop_config: Path | None,
    omop_cohort: int | None,
    omop_person_ids: Path | None,
    at: str | None,
    out: Path,
) -> Path:
    """The patients file the batch is planned from: --patients, or the --omop persons read into `out`."""
    if (patients is None) == (omop is None):
        fail("give the patients: --patients FILE or --omop URL (one of them)")
    if omop is None:
        return patients
    if at is None:
        fail("--omop needs --at YYYY-MM-DD (ages are computed at it, never at 'today')")
    from verdict.data_gen.fhir.cli import reference_date
    from verdict.data_gen.omop.cli import omop_config as read_omop_config

    from .omop_patients import omop_patients_file

    cfg = read_omop_config(omop, omop_config, omop_cohort, omop_person_ids)
    return omop_patients_file(out, cfg, reference_date(at), _say)


def submit_batch(out: Path, scripts: dict[str, Path], wait: bool, timeout: float) -> None:
    """Submit the array and its merge job (printed as JSON); with `wait`, follow them to the summary."""
    from verdict.slurm.submit import Job, slurm_env, submit_jobs

    env = slurm_env()
    # afterany: merge what finished even if a task failed (its pairs are reported missing)
    ids = submit_jobs(
        [
            Job("match", scripts["match"]),
            Job("merge", scripts["match-merge"], after=["match"], when="afterany"),
        ],
        env,
    )
    typer.echo(json.dumps({"array": ids["match"], "merge": ids["merge"]}))
    if wait:
        wait_for_batch(out, [ids["match"], ids["merge"]], env, timeout)


def wait_for_batch(out: Path, jobs: list[str], env: dict[str, str], timeout: float) -> None:
    """Show the jobs' progress until they end, then print the summary; exit 1 if any pair is missing."""
    from verdict.slurm.submit import wait_for

    from .match_batch import merge_results

    states = wait_for(
        jobs, timeout=timeout, env=env, on_change=lambda s: _say(f"jobs: {s}; " + _progress_line(out))
    )
    summary = merge_results(out)
    typer.echo(json.dumps({"jobs": states, "summary": summary}, indent=2))
    if any(s != "COMPLETED" for s in states.values()) or summary["missing"]:
        raise typer.Exit(1)


def _progress_line(out: Path) -> str:
    from .match_batch import load_plan, read_results, result_path

    plan = load_plan(out)
    done = sum(len(read_results(result_path(out, i))) for i in range(plan.shards))
    return f"{done}/{plan.counts.get('pairs', '?')} pairs done"


@app.command("worker")
def worker_cmd(
    out: Path = typer.Option(..., help="batch folder"),
    shard: int = typer.Option(..., help="shard index (SLURM_ARRAY_TASK_ID)"),
    formalizer_url: str | None = typer.Option(None, help="use this running server instead of starting vLLM"),
) -> None:
    """Match one shard's pairs (only those without a result yet)."""
    from .match_batch import run_shard

    counts = asyncio.run(run_shard(out, shard, formalizer_url=formalizer_url, progress=_say))
    typer.echo(json.dumps(counts))


@app.command("merge")
def merge_cmd(out: Path = typer.Option(..., help="batch folder")) -> None:
    """Merge the shards' results into out/results.jsonl (deduplicated) and out/summary.json."""
    from .match_batch import merge_results

    typer.echo(json.dumps(merge_results(out), indent=2))


@app.command("status")
def status_cmd(out: Path = typer.Option(..., help="batch folder")) -> None:
    """Pairs done per shard."""
    from .match_batch import load_inputs, load_plan, read_results, result_path, shard_of

    plan = load_plan(out)
    _, _, pairs = load_inputs(plan)
    for i in range(plan.shards):
        total = sum(1 for _, t in pairs if shard_of(t, plan.shards) == i)
        done = len({(r.patient_id, r.trial_id) for r in read_results(result_path(out, i))})
        typer.echo(f"shard {i}: {done}/{total}")


@app.command("rescreen")
def rescreen_cmd(
    config: str | None = typer.Option(None, "--config", "-c", help="serve config (api.audit_db, limits)"),
    db: str | None = typer.Option(None, "--db", help="or the store: a SQLite file or postgresql:// URL"),
    password_env: str | None = typer.Option(None, help="with a --db URL: variable with the password"),
    policy: str | None = typer.Option(None, help="re-decide this policy's decisions of another version"),
    trial: str | None = typer.Option(None, help="re-decide this trial's decisions on another version"),
    out: Path | None = typer.Option(None, help="JSON report (default: runs/match/rescreen-TIME.json)"),
) -> None:
    """Re-decide stored resolved patients with the core, no LLM call, after a policy or program change.
    Prints the changed decisions (old and new side by side), writes them as superseding decisions and
    the whole report as JSON. Rerunning writes nothing new."""
    from ..reviews.rescreen import run_rescreen

    if (config is None) == (db is None):
        fail("give --config NAME or --db PATH|URL")
    if (policy is None) == (trial is None):
        fail("give --policy NAME or --trial ID")
    table, summary = run_rescreen(config, db, password_env, policy=policy, trial_id=trial, out=out)
    typer.echo(table)
    _say(summary)
