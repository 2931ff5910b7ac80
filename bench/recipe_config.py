"""The Table 2 recipe's config (`configs/bench/recipes/NAME.yaml`): reproduce the paper's
Qwen2.5-7B rows on TREC 2021 at a site - teacher outputs from an API model on the training trials,
LoRA training of both students, their evaluation, and the benchmark of Verdict with the base and the
distilled Qwen against the API teacher on held-out pairs.

Everything the chain writes goes under ``work_dir/NAME/``; the TREC corpus location is a config
value (the shared subset on these machines, the full track corpus at a site).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from verdict.core.configs import StrictModel
from verdict.core.program import Id
from verdict.slurm.job_config import JobResources

from .protocol import BenchError


class Corpus(StrictModel):
    """TREC 2021 Clinical Trials in the benchmarks layout."""

    pairs: str = Field(
        "../shared/data/benchmarks/pairs_trec2021.jsonl", description="qrels: patient_id, nct_id, score"
    )
    patients: str = "../shared/data/benchmarks/patients_trec2021.jsonl"
    trials: list[str] = Field(default_factory=lambda: ["../shared/data/benchmarks/trials.jsonl"])


class SplitSettings(StrictModel):
    """How held-out pairs are chosen: `seeded` (a class-balanced seeded sample; every trial of a
    held-out pair is held out with it) or `paper` (the paper's 80/20 split by trial: the sorted
    unique NCT ids, every `test_every`-th to the test side; then test pairs without a usable
    program are dropped and counted as parse-limited). `split: paper` is short for `{method: paper}`."""

    method: Literal["seeded", "paper"] = Field(
        "seeded", description="seeded sampling or the paper's split by trial"
    )
    heldout_per_class: int = Field(
        100, ge=1, description="seeded: held-out evaluation pairs per label (class-balanced)"
    )
    seed: int = Field(0, description="seeded: the sample's seed (and the cap on training trials)")
    test_every: int = Field(
        5, ge=2, description="paper: every N-th of the sorted NCT ids is a test trial (5: 80/20)"
    )
    max_train_trials: int | None = Field(None, ge=1, description="cap the teacher's training trials (cost)")


class StudentSettings(StrictModel):
    base_model: str = Field("../models/Qwen2.5-7B-Instruct", description="local copy of the base model")
    train_configs: dict[str, str] = Field(
        default_factory=lambda: {"parser": "parser", "value_miner": "value_miner"},
        description="per task: a config in configs/train (or a path)",
    )
    train_overrides: list[str] = Field(default_factory=list, description="--set for both trainings")
    eval_config: str = "eval"
    eval_overrides: list[str] = Field(default_factory=list, description="--set for both evaluations")
    limits: str | None = Field(
        None,
        description="configs/limits/NAME.yaml (e.g. paper): max_tokens, vllm.max_model_len "
        "and the students' context and tokenizer derive from it",
    )
    max_tokens: dict[str, int] = Field(
        default_factory=lambda: {"parser": 3072, "miner_inclusion": 3072, "miner_exclusion": 3072},
        description="output limits of the students' calls in the benchmark",
    )
    llm_match_max_tokens: int = Field(
        3072, gt=0, description="output limit of the direct matcher on base Qwen"
    )
    vllm: dict = Field(
        default_factory=lambda: {"device": "gpu", "max_model_len": 8192},
        description="more serve.vllm_config.VLLMConfig keys for the benchmark's vLLM server",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_limits(cls, data):
        from verdict.data_gen.formalizer import STUDENT_STAGES, apply_limits

        return apply_limits(
            data,
            "recipe students",
            lambda lim: {
                **{("max_tokens", s): lim.stage_tokens(s) for s in STUDENT_STAGES},
                ("vllm", "max_model_len"): lim.max_length,
            },
        )


def _cpu(time: str, mem: str, cpus: int) -> JobResources:
    return JobResources(time=time, mem=mem, cpus=cpus, gpus=0, signal_seconds=0)


class RecipeJobs(StrictModel):
    """Resources of the recipe's own jobs (training and evaluation use the slurm config's)."""

    teacher: JobResources = Field(default_factory=lambda: _cpu("1-00:00:00", "8G", 4))
    export: JobResources = Field(default_factory=lambda: _cpu("1:00:00", "8G", 2))
    bench: JobResources = Field(
        default_factory=lambda: JobResources(time="12:00:00", mem="64G", signal_seconds=0)
    )


class RecipeConfig(StrictModel):
    name: Id
    description: str = ""
    work_dir: str = Field("runs/recipes", description="the chain writes to WORK_DIR/NAME/")
    cache: str = Field("runs/teacher-cache.sqlite", description="call cache shared with every teacher run")
    corpus: Corpus = Field(default_factory=Corpus)
    split: SplitSettings = Field(default_factory=SplitSettings)

    @field_validator("split", mode="before")
    @classmethod
    def _split_by_name(cls, v):
        return {"method": v} if isinstance(v, str) else v

    teacher: str = Field(description="the API teacher: configs/teachers name or path")
    teacher_budget_usd: float | None = Field(None, ge=0)
    bench_budget_usd: float | None = Field(None, ge=0)
    policy: str = "prescreen"
    llm_match: bool = Field(
        True, description="also run the direct-matcher baseline on the teacher and base Qwen"
    )
    students: StudentSettings = Field(default_factory=StudentSettings)
    jobs: RecipeJobs = Field(default_factory=RecipeJobs)
    reference_points: list[dict] = Field(
        default_factory=list, description="published rows shown in the report"
    )

    @property
    def root(self) -> Path:
        return Path(self.work_dir) / self.name


def load_recipe(name_or_path: str | Path, overrides: list[str] | None = None) -> RecipeConfig:
    from verdict.core.configs import load_config

    return load_config("bench/recipes", RecipeConfig, name_or_path, overrides, BenchError, "recipe")[1]
