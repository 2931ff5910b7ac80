"""`verdict train ...` commands. Keep module-level imports light: heavy stacks load inside commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from verdict.core.cli_errors import fail, guarded

app = typer.Typer(help="train commands", no_args_is_help=False, invoke_without_command=True)

SET_HELP = "override a config key, e.g. --set lr=1e-4 --set lora.r=16 (repeatable)"


def _run(fn):
    """Run a command body; bad input becomes 'error: ...' (exit 2), an interrupted run exit 3."""
    from .sft_trainer import TrainingInterrupted

    return guarded(fn, {TrainingInterrupted: 3})


@app.callback()
def train_cmd(
    ctx: typer.Context,
    config: str | None = typer.Option(
        None, "--config", "-c", help="train config: a name in configs/train or a YAML path"
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    overwrite: bool = typer.Option(False, help="discard an existing run directory of the same name"),
    check: bool = typer.Option(False, "--check", help="run every check (model, template, data) and stop"),
) -> None:
    """Train a student: `verdict train --config configs/train/parser.yaml [--set KEY=VALUE ...]`."""
    if ctx.invoked_subcommand is not None:
        if config or set_ or overwrite or check:
            fail("--config/--set/--overwrite/--check belong to training; put them after the subcommand")
        return
    if config is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)

    def body():
        from verdict.core.configs import find_config

        from .sft_config import load_train_config
        from .sft_trainer import prepare, train

        cfg = load_train_config(find_config("train", config), set_)
        if check:
            prep = prepare(cfg)
            typer.echo(
                json.dumps(
                    {
                        "ok": True,
                        "run_dir": str(prep.cfg.run_dir),
                        "task": prep.cfg.task,
                        "train_records": len(prep.train_set),
                        "train_tokens_per_epoch": prep.train_tokens,
                        "eval_records": len(prep.eval_set) if prep.eval_set is not None else 0,
                        "dropped_overlong": prep.dropped_overlong,
                        "datasets": prep.datasets,
                        "training_template": "tokenizer's own"
                        if prep.training_template is None
                        else "TRL training variant",
                    },
                    indent=2,
                )
            )
            return
        result = train(cfg, overwrite=overwrite)
        typer.echo(
            json.dumps(
                {
                    "run_dir": str(result.run_dir),
                    "adapter": str(result.adapter_dir),
                    "status": result.status,
                    "global_step": result.global_step,
                    "resumed_from": result.resumed_from,
                    "metrics": result.metrics,
                },
                indent=2,
            )
        )

    _run(body)


@app.command("eval")
def eval_cmd(
    run: Path = typer.Option(..., "--run", help="run directory (written by `verdict train`)"),
    split: str = typer.Option("test", help="dataset split to evaluate"),
    config: str = typer.Option(
        "eval", "--config", "-c", help="eval config: name in configs/train or YAML path"
    ),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    dataset: list[str] = typer.Option(
        [],
        "--dataset",
        help="evaluate on this exported dataset instead of the "
        "run's own (repeatable; e.g. the site's and the public test sets)",
    ),
    shard: int = typer.Option(0, help="this shard (SLURM array task id)"),
    num_shards: int = typer.Option(1, help="number of shards the records are split into"),
    report: bool = typer.Option(
        True,
        "--report/--no-report",
        help="write the report after generating (array shards: --no-report, then one --report-only job)",
    ),
    report_only: bool = typer.Option(False, help="do not generate; report from existing predictions"),
    fresh: bool = typer.Option(False, help="discard earlier predictions of this run and split first"),
) -> None:
    """Score a student on a split: JSON/schema validity, atom and decision agreement, tokens/s."""

    def body():
        from verdict.core.configs import find_config

        from .eval import evaluate, rate_value
        from .eval_config import load_eval_config

        cfg = load_eval_config(find_config("train", config), set_)
        reports = evaluate(
            run,
            split,
            cfg,
            datasets=dataset or None,
            shard=shard,
            num_shards=num_shards,
            do_generate=not report_only,
            do_report=report or report_only,
            fresh=fresh,
        )
        for r in reports:
            d = r["decisions"]
            typer.echo(
                json.dumps(
                    {
                        "dataset": r["dataset"],
                        "split": r["split"],
                        "records": r["records"],
                        # one line of bare rates; report.json has their k, n and 95% intervals
                        **{k: rate_value(v) for k, v in r["validity"].items()},
                        "exact_match": rate_value(r["exact_match"]),
                        "atoms": {k: rate_value(v) for k, v in r["atoms"].items()},
                        "decision_agreement": rate_value(d.get("agreement")) if d.get("available") else None,
                        "decision_pairs": d.get("pairs"),
                        "tokens_per_second": r["performance"]["tokens_per_second"],
                    },
                    sort_keys=False,
                )
            )

    _run(body)


@app.command("compare")
def compare_cmd(
    runs: list[Path] = typer.Argument(..., help="run directories whose eval reports to put side by side"),
    split: str = typer.Option("test"),
) -> None:
    """Side-by-side table of eval reports (e.g. before and after fine-tuning on a site's trials)."""

    def body():
        from .eval import compare

        typer.echo(compare([str(r) for r in runs], split))

    _run(body)


@app.command("merge")
def merge_cmd(
    run: Path = typer.Option(..., "--run", help="run directory"),
    out: Path | None = typer.Option(None, help="destination (default: RUN/merged)"),
) -> None:
    """Merge the run's adapter into its base model and save the result (export)."""

    def body():
        from .sft_trainer import merge

        typer.echo(str(merge(run, out)))

    _run(body)


@app.command("make-tiny")
def make_tiny_cmd(
    out_dir: Path = typer.Argument(..., help="folder to write the tiny model into"),
    seed: int = typer.Option(0),
) -> None:
    """Build an offline tiny Qwen2-architecture student (tests, CI, demo): < 1 s, about 1.5 MB."""

    def body():
        from .tiny import build_tiny_student

        typer.echo(str(build_tiny_student(out_dir, seed=seed)))

    _run(body)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
