"""Render sbatch scripts from configs (slurm/templates/*.sbatch.j2).

    scripts = render_train_chain(slurm_cfg, "configs/train/parser.yaml", out_dir)   # train + eval (+ report)
    path = render_job("serve", slurm_cfg, "serve-students", "verdict serve vllm --config ...", out_dir)

sbatch reads ``#SBATCH`` lines before any shell runs, so every value there is rendered in
literally (paths absolute); the only shell variable a command uses is SLURM_ARRAY_TASK_ID.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from verdict.core.errors import VerdictError

from .job_config import JobResources, SlurmConfig

TEMPLATES = Path(__file__).resolve().parent / "templates"
KINDS = ("train", "eval", "serve")
SHARD_VAR = '"${SLURM_ARRAY_TASK_ID:-0}"'


class RenderError(VerdictError):
    """A job script cannot be rendered (unknown kind, bad name, bad config)."""


@dataclass
class ChainScripts:
    """The rendered train -> eval (-> report) chain of one run."""

    run_name: str
    run_dir: Path
    train: Path
    eval: Path
    eval_report: Path | None = None
    shards: int = 1
    extra: dict = field(default_factory=dict)


def _env(extra_templates: tuple[Path, ...] = ()):
    """Templates of slurm/templates, and of the given folders first (a part's own job templates
    extend base.sbatch.j2, e.g. bench/templates)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(p) for p in (*extra_templates, TEMPLATES)]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    return env


def job_name(kind: str, name: str) -> str:
    n = f"verdict-{kind}-{name}"
    if not re.match(r"^[A-Za-z0-9_.+-]{1,128}$", n):
        raise RenderError(f"job name '{n}' may only use letters, digits and _ . + - (rename the run)")
    return n


def render_text(
    template: str,
    kind: str,
    slurm: SlurmConfig,
    name: str,
    command: str,
    res: JobResources,
    array: str | None = None,
    templates: tuple[Path, ...] = (),
    **extra,
) -> str:
    """One job script's text; `templates`: a part's own template folders, searched first."""
    slurm = slurm.resolved()
    if "\n" in command:
        raise RenderError("the job command must be one line")
    # slurm does not create the folder of --output, and a job without it fails before it starts
    Path(slurm.log_dir).mkdir(parents=True, exist_ok=True)
    return (
        _env(tuple(templates))
        .get_template(template)
        .render(
            job_name=job_name(kind, name),
            log_dir=slurm.log_dir,
            workdir=slurm.workdir,
            res=res,
            gres_name=slurm.gres_name,
            partition=res.partition or slurm.partition,
            account=slurm.account,
            qos=slurm.qos,
            array=array,
            extra_sbatch=slurm.extra_sbatch,
            env=slurm.env,
            setup=slurm.setup,
            command=command,
            **extra,
        )
    )


def write_script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def render_job(
    kind: str,
    slurm: SlurmConfig,
    name: str,
    command: str | list[str],
    out_dir: str | Path,
    res: JobResources | None = None,
) -> Path:
    """Any single-GPU job from a command and resources (the generic entry point, e.g. for serving)."""
    if kind not in KINDS:
        raise RenderError(f"unknown job kind '{kind}' (known: {', '.join(KINDS)})")
    cmd = command if isinstance(command, str) else shlex.join(command)
    res = res or getattr(slurm.jobs, kind)
    text = render_text(
        f"{kind}.sbatch.j2",
        kind,
        slurm,
        name,
        cmd,
        res,
        run_name=name,
        task="",
        run_dir="",
        split="",
        shards=1,
        report_only=False,
    )
    return write_script(Path(out_dir) / f"{kind}.sbatch", text)


def train_command(train_config: Path, overrides: list[str]) -> str:
    parts = ["verdict", "train", "--config", str(train_config)]
    for o in overrides:
        parts += ["--set", o]
    return shlex.join(parts)


def eval_command(
    run_dir: Path,
    split: str,
    eval_config: str,
    eval_overrides: list[str],
    shards: int,
    report_only: bool = False,
) -> str:
    parts = ["verdict", "train", "eval", "--run", str(run_dir), "--split", split, "--config", eval_config]
    for o in eval_overrides:
        parts += ["--set", o]
    cmd = shlex.join(parts)
    if report_only:
        return cmd + " --report-only"
    if shards > 1:
        return cmd + f" --num-shards {shards} --shard {SHARD_VAR} --no-report"
    return cmd


def render_train_chain(
    slurm: SlurmConfig,
    train_config: str | Path,
    out_dir: str | Path | None = None,
    train_overrides: list[str] | None = None,
    eval_config: str = "eval",
    eval_overrides: list[str] | None = None,
    split: str = "test",
    check: bool = False,
) -> ChainScripts:
    """train.sbatch, eval.sbatch (an array when jobs.eval.shards > 1) and eval_report.sbatch.
    ``check``: first run every check of `verdict train --check` (base model, chat template, datasets),
    so a chain whose model or data is missing is refused before anything is written or queued."""
    from verdict.core.configs import find_config
    from verdict.train.sft_config import load_train_config

    train_overrides = list(train_overrides or [])
    eval_overrides = list(eval_overrides or [])
    tc_path = find_config("train", str(train_config)).resolve()
    cfg = load_train_config(tc_path, train_overrides).resolved()  # refuses bad keys before anything is queued
    if eval_config:
        from verdict.train.eval_config import load_eval_config

        ec_path = find_config("train", eval_config).resolve()
        load_eval_config(ec_path, eval_overrides)
        eval_config = str(ec_path)
    run_dir = cfg.run_dir
    # Beside the run directory, not in it: the run directory belongs to the trainer.
    out = Path(out_dir) if out_dir else run_dir.parent / f"{cfg.name}.slurm"
    shards = slurm.jobs.eval.shards
    common = dict(run_name=cfg.name, task=cfg.task, run_dir=str(run_dir), split=split, shards=shards)
    texts = {}
    texts["train"] = (
        out / "train.sbatch",
        render_text(
            "train.sbatch.j2",
            "train",
            slurm,
            cfg.name,
            train_command(tc_path, train_overrides),
            slurm.jobs.train,
            report_only=False,
            **common,
        ),
    )
    texts["eval"] = (
        out / "eval.sbatch",
        render_text(
            "eval.sbatch.j2",
            "eval",
            slurm,
            cfg.name,
            eval_command(run_dir, split, eval_config, eval_overrides, shards),
            slurm.jobs.eval,
            array=f"0-{shards - 1}" if shards > 1 else None,
            report_only=False,
            **common,
        ),
    )
    if shards > 1:
        texts["eval_report"] = (
            out / "eval_report.sbatch",
            render_text(
                "eval.sbatch.j2",
                "eval-report",
                slurm,
                cfg.name,
                eval_command(run_dir, split, eval_config, eval_overrides, shards, report_only=True),
                slurm.jobs.eval_report,
                report_only=True,
                **common,
            ),
        )
    if check:
        from verdict.train.sft_trainer import prepare

        prepare(cfg)
    paths = {kind: write_script(path, text) for kind, (path, text) in texts.items()}
    return ChainScripts(
        run_name=cfg.name,
        run_dir=run_dir,
        train=paths["train"],
        eval=paths["eval"],
        eval_report=paths.get("eval_report"),
        shards=shards,
    )
