"""SlurmConfig: a site's cluster settings and per-job resources (configs/slurm/NAME.yaml).

Every job of the project is a single-GPU job (the paper ran 89 of them on one 48 GB GPU each, with
2-10 h limits); the resources per kind of job live here, the science in the train/eval configs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, field_validator
from verdict.core import configs
from verdict.core.configs import StrictModel

# sbatch accepts "minutes", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS"
TIME_RE = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$")
MEM_RE = re.compile(r"^\d+[KMGT]?$")


class JobResources(StrictModel):
    time: str = Field(description="wall-clock limit, sbatch syntax (e.g. 10:00:00 or 1-00:00:00)")
    mem: str = Field(description="memory per node, sbatch syntax (e.g. 64G)")
    cpus: int = Field(default=8, ge=1, description="--cpus-per-task")
    gpus: int = Field(default=1, ge=0, le=1, description="GPUs (GRES gpu); single-GPU jobs by design")
    partition: str | None = Field(default=None, description="overrides the cluster partition for this job")
    signal_seconds: int = Field(
        default=300,
        ge=0,
        description="SIGTERM this long before the time limit so a "
        "training run checkpoints and can resume (0 = none)",
    )

    @field_validator("time", "mem", mode="before")
    @classmethod
    def _numbers_are_sbatch_units(cls, v):
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # time: minutes, mem: MB

    @field_validator("time")
    @classmethod
    def _time(cls, v: str) -> str:
        if not TIME_RE.match(v):
            raise ValueError(f"'{v}' is not an sbatch time (minutes, HH:MM:SS, D-HH:MM:SS, ...)")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: str) -> str:
        if not MEM_RE.match(str(v)):
            raise ValueError(f"'{v}' is not an sbatch memory size (e.g. 64G, 4000M)")
        return str(v)


class EvalJob(JobResources):
    shards: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="array tasks the eval records are split into; "
        "> 1 adds a report job that runs after all of them",
    )


class ReportJob(JobResources):
    gpus: int = Field(default=0, ge=0, le=1)


def _train_default() -> JobResources:
    return JobResources(time="10:00:00", mem="64G")


def _eval_default() -> EvalJob:
    return EvalJob(time="4:00:00", mem="48G")


def _report_default() -> ReportJob:
    return ReportJob(time="1:00:00", mem="8G", cpus=2, gpus=0, signal_seconds=0)


def _serve_default() -> JobResources:
    return JobResources(time="7-00:00:00", mem="64G", signal_seconds=0)


class Jobs(StrictModel):
    train: JobResources = Field(default_factory=_train_default)
    eval: EvalJob = Field(default_factory=_eval_default)
    eval_report: ReportJob = Field(default_factory=_report_default)
    serve: JobResources = Field(default_factory=_serve_default)


class SlurmConfig(StrictModel):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gres_name: str = Field(default="gpu", description="GRES name, or 'gpu:TYPE' (e.g. gpu:a6000)")
    workdir: str = Field(
        default=".", description="the checkout the jobs run in (rendered as an absolute path)"
    )
    log_dir: str = Field(default="slurm-logs", description="job logs, named %x-%j.out (job name - job id)")
    setup: list[str] = Field(
        default_factory=lambda: ["source .venv/bin/activate"],
        description="shell lines run in workdir before the job's command (modules, venv)",
    )
    env: dict[str, str] = Field(
        default_factory=lambda: {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    extra_sbatch: list[str] = Field(
        default_factory=list, description="more #SBATCH options, e.g. ['--constraint=a6000']"
    )
    jobs: Jobs = Field(default_factory=Jobs)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise ValueError(f"'{k}' is not a valid environment variable name")
        return v

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for opt in v:
            if not opt.startswith("-") or "\n" in opt:
                raise ValueError(
                    f"extra_sbatch entry '{opt}' must be one sbatch option such as --constraint=a6000"
                )
        return v

    def resolved(self) -> SlurmConfig:
        ab = lambda p: str(Path(os.path.expanduser(p)).resolve())  # noqa: E731
        return self.model_copy(update={"workdir": ab(self.workdir), "log_dir": ab(self.log_dir)})


def load_slurm_config(path: str | os.PathLike, overrides: list[str] | None = None) -> SlurmConfig:
    return configs.load(SlurmConfig, path, overrides)
