"""EvalConfig: how `verdict train eval` generates and scores (configs/train/eval.yaml)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from verdict.core import configs
from verdict.core.configs import StrictModel


class EvalConfig(StrictModel):
    limits: str | None = Field(
        default=None, description="configs/limits/NAME.yaml: max_new_tokens derives from it (paper: 3072)"
    )
    batch_size: int = Field(default=16, ge=1, description="prompts per generate() call (paper: 16)")
    max_new_tokens: int = Field(default=3072, ge=1, description="generation budget per record (paper: 3072)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        default="auto", description="auto: bf16 on a GPU, fp32 on a CPU"
    )
    policy: str = Field(default="prescreen", description="missingness policy for the decision agreement")
    engine_timeout_ms: int = Field(default=5000, ge=1)
    programs: str | None = Field(
        default=None,
        description="value_miner eval: the parser dataset holding the "
        "teacher's programs; default: the 'parser' folder beside the dataset",
    )
    pairs: str | None = Field(
        default=None,
        description="parser eval: the value_miner dataset holding the "
        "teacher's values for each patient-trial pair; default: the 'value_miner' folder "
        "beside the dataset",
    )
    limit: int | None = Field(
        default=None, ge=1, description="evaluate only the first N records of the split"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_limits(cls, data):
        from verdict.data_gen.formalizer import apply_limits

        return apply_limits(data, "eval settings", lambda lim: {("max_new_tokens",): lim.max_new_tokens})


def load_eval_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> EvalConfig:
    if path is None:
        return configs.build(EvalConfig, {}, overrides, where="eval settings")
    return configs.load(EvalConfig, Path(path), overrides)
