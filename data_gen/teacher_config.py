"""The teacher pipeline's run config (`configs/teacher_runs/NAME.yaml`): which endpoints (by
name, `formalizer/endpoint_config.py`) do which stages, on which trials, patients and pairs, under
which budget. Strict: an unknown or misspelled key is an error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, model_validator
from verdict.core.configs import StrictModel, load_config
from verdict.core.program import Id
from verdict.data_gen.formalizer import ConfigError, DataClass, EgressConfig

RunStage = Literal["parser", "miner_inclusion", "miner_exclusion"]
RUN_STAGES: tuple[str, ...] = get_args(RunStage)
# The chart reader's records are their own dataset (task `reader`), trained into the value-miner
# adapter (sft_record.ADAPTER_TASKS).
TASK_OF_STAGE = {
    "parser": "parser",
    "miner_inclusion": "value_miner",
    "miner_exclusion": "value_miner",
    "reader": "reader",
}


class TrialSource(StrictModel):
    path: str = Field(
        description="trials JSONL (benchmarks layout) or ClinicalTrials.gov study JSON file/folder"
    )
    format: Literal["auto", "jsonl", "ctgov"] = "auto"
    ids: list[str] | None = None
    limit: int | None = Field(None, ge=0)


class PatientSource(StrictModel):
    path: str = Field(description="patients JSONL: {_id, text, metadata}")
    data_class: DataClass = Field(
        "private",
        description="public/synthetic lets API teachers see the notes; private keeps them on allowed hosts",
    )
    ids: list[str] | None = None
    limit: int | None = Field(None, ge=0)


class PairSource(StrictModel):
    path: str = Field(description="pairs JSONL: {patient_id, nct_id, score}")
    scores: list[int] | None = Field(None, description="keep only pairs with these scores (e.g. [1, 2])")
    limit: int | None = Field(None, ge=0)


class RunTeachers(StrictModel):
    parser: str | None = None
    miner: str | None = None


class RunPrompts(StrictModel):
    parser: str = "v1"
    miner_inclusion: str = "v2"  # sparse answers (prompt_templates.DEFAULT_VERSIONS)
    miner_exclusion: str = "v2"


class RunConfig(StrictModel):
    name: Id
    description: str = ""
    out_dir: str = Field("runs", description="runs are written to OUT_DIR/NAME/")
    cache: str = Field(
        "runs/teacher-cache.sqlite", description="content-addressed call cache, shared by runs"
    )
    teachers: RunTeachers
    stages: list[RunStage] = Field(default_factory=lambda: list(RUN_STAGES), min_length=1)
    prompts: RunPrompts = Field(default_factory=RunPrompts)
    trials: TrialSource
    patients: PatientSource | None = None
    pairs: PairSource | None = Field(
        None, description="which patient-trial pairs to mine; default: all combinations"
    )
    budget_usd: float | None = Field(None, ge=0)
    egress: EgressConfig = Field(default_factory=EgressConfig)

    @model_validator(mode="after")
    def _consistent(self):
        mining = [s for s in self.stages if s != "parser"]
        if "parser" in self.stages and not self.teachers.parser:
            raise ValueError("stage 'parser' needs teachers.parser")
        if mining and not self.teachers.miner:
            raise ValueError(f"stages {mining} need teachers.miner")
        if mining and self.patients is None:
            raise ValueError(f"stages {mining} need a patients source")
        if mining and "parser" not in self.stages:
            raise ValueError("the miner stages take their trial programs from the parser stage: add 'parser'")
        return self

    def teacher_for(self, stage: str) -> str:
        name = self.teachers.parser if stage == "parser" else self.teachers.miner
        assert name is not None
        return name


def load_run_config(name_or_path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """configs/teacher_runs/NAME.yaml (or a path); ``overrides`` as ``--set key=value``."""
    return load_config("teacher_runs", RunConfig, name_or_path, overrides, ConfigError, "run")[1]
