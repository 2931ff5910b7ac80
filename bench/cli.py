"""`verdict bench ...` commands. Keep module-level imports light: heavy stacks load inside commands."""

import os
from pathlib import Path

import typer
from verdict.core.cli_errors import fail, guarded

app = typer.Typer(help="bench commands", no_args_is_help=True)


@app.command()
def core(
    directory: Path | None = typer.Argument(
        None,
        help="reference corpus (default: $VERDICT_REFERENCE_DIR, else ../shared/data/reference/v6 "
        "beside the checkout)",
    ),
    policy: str = typer.Option("prescreen", help="policy name or YAML path"),
    repeats: int = typer.Option(3, help="timed runs per pair for cold and warm"),
    naive: bool = typer.Option(True, help="also time the naive baseline"),
) -> None:
    """Latency of the decision engine's full artifact set, cold and warm, against a naive baseline."""
    from verdict.core.configs import source_checkout
    from verdict.core.errors import VerdictError
    from verdict.core.policy import load_policy

    from .core_latency import report, run

    checkout = source_checkout()
    folder = directory or (
        Path(os.environ["VERDICT_REFERENCE_DIR"])
        if os.environ.get("VERDICT_REFERENCE_DIR")
        else checkout.parent / "shared" / "data" / "reference" / "v6"
        if checkout
        else None
    )
    if folder is None:
        typer.echo(
            "error: name the reference corpus folder (argument DIRECTORY or $VERDICT_REFERENCE_DIR)", err=True
        )
        raise typer.Exit(2)
    try:
        result = run(folder, load_policy(policy), repeats=repeats, naive=naive, progress=typer.echo)
    except (VerdictError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    for line in report(result):
        typer.echo(line)


EXIT_BUDGET = 3  # stopped cleanly at the budget (as `verdict teacher run`)


@app.command()
def run(
    config: str = typer.Option(
        ...,
        "--config",
        "-c",
        help="bench config: a name in configs/bench or a YAML path "
        "(a run directory's config.yaml reproduces that run)",
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="override a config key, e.g. --set dataset.sample.per_class=10"
    ),
    restart: bool = typer.Option(False, help="discard the run directory's results and start over"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bars on stderr"),
    report_only: bool = typer.Option(
        False,
        "--report-only",
        help="rewrite results.json, report.md and plots from the pairs recorded so far; decide nothing",
    ),
) -> None:
    """Run the backends of a bench config over its dataset (resumable: run it again to continue)."""
    import asyncio

    from .bench_config import load_bench_config
    from .runner import BenchRun

    cfg = load_bench_config(config, set_)
    runner = BenchRun(cfg, progress_bar=progress, restart=restart)
    if report_only:
        if not (cfg.run_dir / "pairs.jsonl").exists():
            fail(f"{cfg.run_dir}: no recorded pairs yet (run without --report-only first)")
        files = runner.write_outputs()  # "complete" only if every backend decided every pair
        typer.echo(f"{files['report']}")
        return
    o = guarded(
        lambda: asyncio.run(runner.run()),
        interrupted="every pair finished so far is kept: run the same command to resume",
    )
    typer.echo(
        f"bench {cfg.name}: {o.status}: {o.done_now} pair results this session, {o.done_before} before; "
        f"paid ${o.paid_usd:.4f}; {o.elapsed_s:.1f} s"
    )
    typer.echo(f"results: {o.files.get('results')}\nreport:  {o.files.get('report')}")
    if o.message:
        typer.echo(o.message, err=True)
    if o.status == "stopped_budget":
        raise typer.Exit(EXIT_BUDGET)
    if o.status != "complete":
        raise typer.Exit(1)


@app.command()
def compare(
    run_a: Path = typer.Argument(..., help="run directory (or its results.json)"),
    run_b: Path = typer.Argument(..., help="run directory (or its results.json)"),
    out: Path | None = typer.Option(None, help="also write the comparison (Markdown) here"),
) -> None:
    """Two runs side by side: scores, latency, cost, flip rates; agreement and McNemar's tests."""

    from .report import compare_runs

    text = compare_runs(run_a, run_b)
    typer.echo(text)
    if out is not None:
        out.write_text(text)


recipe_app = typer.Typer(
    help="the Table 2 recipe: teacher -> LoRA students -> eval -> benchmark (SLURM chain)",
    no_args_is_help=True,
)
app.add_typer(recipe_app, name="recipe")
RECIPE_ARG = typer.Argument(..., help="recipe config: a name in configs/bench/recipes or a YAML path")
RECIPE_SET = typer.Option([], "--set", help="override a recipe key, e.g. --set split.heldout_per_class=50")


_recipe = guarded


@recipe_app.command("prepare")
def recipe_prepare(recipe: str = RECIPE_ARG, set_: list[str] = RECIPE_SET) -> None:
    """Split the TREC pairs (held-out vs training trials) and write the configs the steps read."""
    import json

    from .recipe import prepare
    from .recipe_config import load_recipe

    _recipe(lambda: typer.echo(json.dumps(prepare(load_recipe(recipe, set_)), indent=2)))


@recipe_app.command("steps")
def recipe_steps(recipe: str = RECIPE_ARG, set_: list[str] = RECIPE_SET) -> None:
    """Print the chain's commands in order (what each SLURM job runs)."""
    from .recipe import steps
    from .recipe_config import load_recipe

    def body():
        for s in steps(load_recipe(recipe, set_)):
            typer.echo(
                f"# {s.name}" + (f" (after {', '.join(s.after)})" if s.after else "") + f": {s.purpose}"
            )
            typer.echo(s.line)

    _recipe(body)


def _rendered(recipe, set_, slurm, set_slurm, out):
    from verdict.core.configs import find_config
    from verdict.slurm.job_config import load_slurm_config

    from .recipe import prepare, render
    from .recipe_config import load_recipe

    rc = load_recipe(recipe, set_)
    prepare(rc)
    scfg = load_slurm_config(find_config("slurm", slurm), set_slurm)
    return rc, render(rc, scfg, out)


SLURM_OPT = typer.Option(
    "default", "--slurm", "-s", help="cluster config: a name in configs/slurm or a YAML path"
)
SLURM_SET = typer.Option([], "--set-slurm", help="override a cluster config key")


@recipe_app.command("render")
def recipe_render(
    recipe: str = RECIPE_ARG,
    set_: list[str] = RECIPE_SET,
    slurm: str = SLURM_OPT,
    set_slurm: list[str] = SLURM_SET,
    out: Path | None = typer.Option(None, help="script folder"),
) -> None:
    """prepare, then write one sbatch script per step."""
    import json

    _recipe(
        lambda: typer.echo(
            json.dumps(
                {k: str(v) for k, v in _rendered(recipe, set_, slurm, set_slurm, out)[1].items()}, indent=2
            )
        )
    )


@recipe_app.command("submit")
def recipe_submit(
    recipe: str = RECIPE_ARG,
    set_: list[str] = RECIPE_SET,
    slurm: str = SLURM_OPT,
    set_slurm: list[str] = SLURM_SET,
    out: Path | None = typer.Option(None, help="script folder"),
    wait: bool = typer.Option(False, help="wait for every job and report its final state"),
    timeout: float = typer.Option(7 * 86400, help="--wait: give up after this many seconds"),
) -> None:
    """prepare, render and sbatch the chain (each step afterok the steps it needs); prints the job ids."""
    import json

    def body():
        from verdict.slurm.submit import wait_for

        from .recipe import submit

        rc, scripts = _rendered(recipe, set_, slurm, set_slurm, out)
        ids = submit(rc, scripts)
        typer.echo(json.dumps({"jobs": ids, "scripts": {k: str(v) for k, v in scripts.items()}}, indent=2))
        if wait:
            states = wait_for(
                ids.values(),
                timeout=timeout,
                on_change=lambda s: typer.echo(f"states: {json.dumps(s)}", err=True),
            )
            typer.echo(json.dumps({"states": {k: states[v] for k, v in ids.items()}}))
            if any(s != "COMPLETED" for s in states.values()):
                raise typer.Exit(1)

    _recipe(body)


@recipe_app.command("run")
def recipe_run(
    recipe: str = RECIPE_ARG,
    set_: list[str] = RECIPE_SET,
    only: list[str] = typer.Option([], help="run only these steps (repeatable)"),
) -> None:
    """prepare, then run the steps one after another here (no SLURM)."""
    from .recipe import prepare, run_locally
    from .recipe_config import load_recipe

    def body():
        rc = load_recipe(recipe, set_)
        prepare(rc)
        run_locally(rc, progress=lambda m: typer.echo(m, err=True), only=only or None)

    _recipe(body)
