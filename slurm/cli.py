"""`verdict slurm ...` commands. Keep module-level imports light: heavy stacks load inside commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from verdict.core.cli_errors import fail, guarded

app = typer.Typer(help="slurm commands", no_args_is_help=True)
cluster_app = typer.Typer(
    help="a real one-node SLURM cluster in a folder (CI, tests, trying the scripts)", no_args_is_help=True
)
app.add_typer(cluster_app, name="local-cluster")

SLURM_OPT = typer.Option(
    "default", "--slurm", "-s", help="cluster config: a name in configs/slurm or a YAML path"
)
SET_SLURM = typer.Option(
    [], "--set", help="override a cluster config key, e.g. --set jobs.train.time=2:00:00"
)
# the train -> eval chain's options, shared by render and submit
TRAIN_OPT = typer.Option(..., "--train", "-t", help="train config (name in configs/train or YAML path)")
SET_TRAIN = typer.Option([], "--set-train", help="override a train config key (repeatable)")
EVAL_CONFIG_OPT = typer.Option("eval", "--eval-config", help="eval config (name in configs/train or path)")
SET_EVAL = typer.Option([], "--set-eval", help="override an eval config key (repeatable)")
SPLIT_OPT = typer.Option("test", help="split the eval job scores")
CHAIN_OUT_OPT = typer.Option(None, help="folder for the scripts (default: <output_dir>/<name>.slurm)")
CHECK_OPT = typer.Option(
    True,
    "--check/--no-check",
    help="first run the checks of `verdict train --check` (base model, template, datasets)",
)


_run = guarded


def _slurm_cfg(name: str, sets: list[str]):
    from verdict.core.configs import find_config

    from .job_config import load_slurm_config

    return load_slurm_config(find_config("slurm", name), sets)


def _chain(slurm, set_, train, set_train, eval_config, set_eval, split, out, check):
    from .render import render_train_chain

    return render_train_chain(
        _slurm_cfg(slurm, set_), train, out, set_train, eval_config, set_eval, split, check=check
    )


def _scripts_json(s) -> dict:
    return {
        "run_dir": str(s.run_dir),
        "train": str(s.train),
        "eval": str(s.eval),
        "eval_report": str(s.eval_report) if s.eval_report else None,
        "eval_shards": s.shards,
    }


@app.command("render")
def render_cmd(
    train: str = TRAIN_OPT,
    slurm: str = SLURM_OPT,
    set_: list[str] = SET_SLURM,
    set_train: list[str] = SET_TRAIN,
    eval_config: str = EVAL_CONFIG_OPT,
    set_eval: list[str] = SET_EVAL,
    split: str = SPLIT_OPT,
    out: Path | None = CHAIN_OUT_OPT,
    check: bool = CHECK_OPT,
) -> None:
    """Render train.sbatch and eval.sbatch (+ eval_report.sbatch for sharded eval) for one run."""
    _run(
        lambda: typer.echo(
            json.dumps(
                _scripts_json(
                    _chain(slurm, set_, train, set_train, eval_config, set_eval, split, out, check)
                ),
                indent=2,
            )
        )
    )


@app.command("render-serve")
def render_serve_cmd(
    name: str = typer.Option("students", help="job name suffix (verdict-serve-NAME)"),
    serve_config: str | None = typer.Option(
        None, help="a serve config: use `verdict serve slurm-job --config NAME` (it checks the config)"
    ),
    command: str | None = typer.Option(None, help="any one-line command to run in the job"),
    slurm: str = SLURM_OPT,
    set_: list[str] = SET_SLURM,
    out: Path = typer.Option(Path("slurm-jobs"), help="folder for serve.sbatch"),
) -> None:
    """Render serve.sbatch (one GPU, long time limit) for a one-line command. For a serve config,
    `verdict serve slurm-job` checks the model and adapters and renders the job."""

    def body():
        from .render import render_job

        if serve_config is not None:
            fail(
                f"for a serve config use `verdict serve slurm-job --config {serve_config}`: it checks the "
                "base model and adapters before anything is queued and says where the API reaches vLLM"
            )
        if command is None:
            fail("give --command (or use `verdict serve slurm-job --config NAME` for a serve config)")
        typer.echo(str(render_job("serve", _slurm_cfg(slurm, set_), name, command, out)))

    _run(body)


@app.command("submit")
def submit_cmd(
    train: str = TRAIN_OPT,
    slurm: str = SLURM_OPT,
    set_: list[str] = SET_SLURM,
    set_train: list[str] = SET_TRAIN,
    eval_config: str = EVAL_CONFIG_OPT,
    set_eval: list[str] = SET_EVAL,
    split: str = SPLIT_OPT,
    out: Path | None = CHAIN_OUT_OPT,
    check: bool = CHECK_OPT,
    only: str | None = typer.Option(None, help="submit only 'train' or only 'eval'"),
    after: str | None = typer.Option(None, help="start after this job id completes (afterok)"),
    wait: bool = typer.Option(False, help="wait for the jobs and report their final states"),
    timeout: float = typer.Option(86400, help="--wait: give up after this many seconds"),
) -> None:
    """Render and sbatch the train -> eval chain (--dependency=afterok); prints the job ids."""

    def body():
        from .submit import submit_chain, wait_for

        if only not in (None, "train", "eval"):
            fail("--only must be 'train' or 'eval'")
        scripts = _chain(slurm, set_, train, set_train, eval_config, set_eval, split, out, check)
        ids = submit_chain(scripts, only=only, after=after)
        result = {"jobs": ids, "scripts": _scripts_json(scripts)}
        typer.echo(json.dumps(result, indent=2))
        if wait:
            states = wait_for(
                ids.values(),
                timeout=timeout,
                on_change=lambda s: typer.echo(f"states: {json.dumps(s)}", err=True),
            )
            typer.echo(json.dumps({"states": states}))
            if any(s != "COMPLETED" for s in states.values()):
                raise typer.Exit(1)

    _run(body)


@app.command("wait")
def wait_cmd(
    job_ids: list[str] = typer.Argument(..., help="job ids (array jobs: the array's id)"),
    timeout: float = typer.Option(86400),
) -> None:
    """Wait for jobs to finish; exit 1 unless all COMPLETED."""

    def body():
        from .submit import wait_for

        states = wait_for(job_ids, timeout=timeout)
        typer.echo(json.dumps(states))
        if any(s != "COMPLETED" for s in states.values()):
            raise typer.Exit(1)

    _run(body)


@cluster_app.command("start")
def cluster_start(
    folder: Path = typer.Argument(..., help="folder for config, state, logs and PIDs"),
    gpus: int = typer.Option(2, help="fake GPUs (GRES backed by mknod'd devices)"),
) -> None:
    """Start slurmctld + slurmd (auth none); prints the SLURM_CONF to export."""

    def body():
        from .local_cluster import LocalCluster

        c = LocalCluster(folder, gpus=gpus).start()
        typer.echo(f"export SLURM_CONF={c.conf}")
        typer.echo(
            f"# daemons: {json.dumps(c.pids())}; stop with: verdict slurm local-cluster stop {folder}",
            err=True,
        )

    _run(body)


@cluster_app.command("stop")
def cluster_stop(folder: Path = typer.Argument(...)) -> None:
    """Stop the daemons of a local cluster by their recorded PIDs."""

    def body():
        from .local_cluster import LocalCluster

        c = LocalCluster(folder)
        if not c.pids():
            fail(f"no running local cluster recorded in {folder}")
        c.stop()
        typer.echo("stopped")

    _run(body)
