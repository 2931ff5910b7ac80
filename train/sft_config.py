"""TrainConfig: one LoRA distillation run (the paper's recipe as defaults, appendix O).

Paths in a config are relative to the working directory (the repository root, like every config
of the project); the run directory stores them resolved, so a run is self-describing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from verdict.core import configs
from verdict.core.configs import StrictModel
from verdict.data_gen.sft_record import TASKS, Task  # noqa: F401  (the one task list; re-exported)


class DatasetSpec(StrictModel):
    """One exported SFT dataset (``verdict teacher export`` writes ``<out>/<task>/``)."""

    path: str = Field(description="folder of a DatasetDict saved with save_to_disk")
    weight: float = Field(
        default=1.0,
        gt=0,
        description="times each record is seen per epoch (0.5 = half of them, "
        "2 = each twice): mixes a site's data with the public set",
    )
    name: str | None = Field(default=None, description="label in reports; default: the folder name")

    @property
    def label(self) -> str:
        p = Path(self.path)
        return self.name or (f"{p.parent.name}/{p.name}" if p.parent.name else p.name)


class LoraSpec(StrictModel):
    r: int = Field(default=32, ge=1)
    alpha: int = Field(default=64, ge=1)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1
    )


class TrainConfig(StrictModel):
    name: str = Field(description="run name; the run directory is <output_dir>/<name>")
    task: Task
    base_model: str = Field(
        description="local folder of the base model (e.g. a Qwen2.5-7B-Instruct copy); "
        "nothing is fetched from a hub"
    )
    datasets: list[DatasetSpec] = Field(min_length=1)
    init_adapter: str | None = Field(
        default=None,
        description="continue training this LoRA adapter (site fine-tuning from the public student)",
    )
    output_dir: str = "runs/students"
    train_split: str = "train"
    eval_split: str | None = Field(
        default="validation", description="loss on this split after each epoch; null = none"
    )

    # -- the paper's recipe (appendix O) ------------------------------------------------------
    lora: LoraSpec = Field(default_factory=LoraSpec)
    lr: float = Field(default=2e-4, gt=0)
    epochs: float = Field(default=3.0, gt=0)
    max_steps: int | None = Field(
        default=None, ge=1, description="stop after this many optimizer steps (overrides epochs)"
    )
    warmup_ratio: float = Field(default=0.05, ge=0, lt=1)
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "linear"
    bf16: bool = True
    limits: str | None = Field(
        default=None,
        description="configs/limits/NAME.yaml (e.g. paper): max_length derives from it, so training, "
        "vLLM's max_model_len and the stages' max_tokens cannot contradict each other",
    )
    max_length: int = Field(default=4096, ge=16, description="prompt + completion tokens of one record")
    assistant_only_loss: bool = True
    training_chat_template: str | None = Field(
        default=None,
        description="jinja file: the base model's chat template with {% generation %} markers around the "
        "assistant turn, for training only (needed only if TRL has no training variant of the model's "
        "template)",
    )

    # -- not in the paper: chosen to fit one 48 GB GPU at 4096 tokens ----------------------------
    batch_size: int = Field(default=2, ge=1, description="per device")
    grad_accum: int = Field(default=8, ge=1, description="gradient accumulation steps (effective batch 16)")
    gradient_checkpointing: bool = True
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    seed: int = 0
    device: Literal["auto", "cuda", "cpu"] = "auto"
    overlong: Literal["drop", "error"] = Field(
        default="drop",
        description="records longer than max_length: drop them (counted in the run info) or refuse the run",
    )

    # -- bookkeeping ----------------------------------------------------------------------------
    logging_steps: int = Field(default=10, ge=1)
    save_steps: int = Field(
        default=200, ge=1, description="checkpoint every N steps (a killed run resumes from the last one)"
    )
    save_total_limit: int = Field(default=2, ge=1)
    merge: bool = Field(default=False, description="also write the base with the adapter merged in (export)")

    @model_validator(mode="before")
    @classmethod
    def _from_limits(cls, data):
        from verdict.data_gen.formalizer import apply_limits

        return apply_limits(data, "train config", lambda lim: {("max_length",): lim.max_length})

    @model_validator(mode="after")
    def _names(self):
        if not self.name or any(c in self.name for c in "/\\") or self.name in (".", ".."):
            raise ValueError(f"name '{self.name}' must be a plain folder name")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    def resolved(self) -> TrainConfig:
        """Paths made absolute, so the run directory and the adapter name what was really used."""
        ab = lambda p: str(Path(os.path.expanduser(p)).resolve()) if p else p  # noqa: E731
        return self.model_copy(
            update={
                "base_model": ab(self.base_model),
                "init_adapter": ab(self.init_adapter),
                "training_chat_template": ab(self.training_chat_template),
                "output_dir": ab(self.output_dir),
                "datasets": [d.model_copy(update={"path": ab(d.path)}) for d in self.datasets],
            }
        )


def load_train_config(path: str | os.PathLike, overrides: list[str] | None = None) -> TrainConfig:
    data = configs.read_yaml(path)
    data.setdefault("name", Path(path).stem)
    return configs.build(TrainConfig, data, overrides, where=f"train config {Path(path).name}")
