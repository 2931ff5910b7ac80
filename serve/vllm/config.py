"""What a vLLM server for the students is started with: one base model, its LoRA adapters, and the
settings that matter for serving formalizers (structured outputs, context length, CPU vs GPU).

Strict (`extra="forbid"`): a misspelled key is an error naming it. Loaded from a serve config file, its
relative paths are taken from the config's `root` (`site_paths`); built in code, from the working
directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from verdict.core.configs import StrictModel, source_checkout

from ..errors import ServeConfigError
from ..site_paths import adapter_folder

ENV_PYTHON = "VERDICT_VLLM_PYTHON"
DEFAULT_PYTHON = Path(".venv-vllm") / "bin" / "python"
# vLLM allocates LoRA slots of these ranks only (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class StructuredOutputs(StrictModel):
    backend: Literal["xgrammar", "guidance", "outlines", "lm-format-enforcer", "auto"] = "xgrammar"
    # Without it small models spend their token budget on whitespace between JSON tokens.
    disable_any_whitespace: bool = True


class VLLMConfig(StrictModel):
    model: str = Field(description="local path of the base model (no hub downloads on site)")
    served_model_name: str = Field("base", description="name the base model is served under")
    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="adapter name (the `model` of a request) -> a training run folder (`verdict train` "
        "writes <output_dir>/<name>; it must have completed, its adapter/ is served) or a LoRA adapter "
        "folder",
    )
    max_lora_rank: int | None = Field(None, description="default: the largest rank in the adapters' configs")
    device: Literal["cpu", "gpu"] = "cpu"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 = a free port chosen at start")
    max_model_len: int = Field(2048, ge=64)
    max_num_seqs: int | None = Field(None, ge=1, description="concurrent sequences (vLLM default if unset)")
    dtype: str = Field("auto", description="auto | float32 | bfloat16 | float16")
    seed: int = 0
    structured_outputs: StructuredOutputs = Field(default_factory=StructuredOutputs)
    python: str | None = Field(
        None, description=f"interpreter of the vLLM environment; default ${ENV_PYTHON} or {DEFAULT_PYTHON}"
    )
    cpu_kvcache_space_gib: int = Field(
        1, ge=1, description="CPU only: KV cache size (VLLM_CPU_KVCACHE_SPACE)"
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="GPU only")
    tensor_parallel_size: int = Field(1, ge=1, description="GPU only")
    ready_timeout_s: float = Field(600.0, gt=0)
    log_file: str | None = Field(None, description="server log; default: a temporary file")
    extra_args: list[str] = Field(default_factory=list, description="more vllm serve arguments, verbatim")

    @field_validator("adapters")
    @classmethod
    def _adapter_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not name or any(c in name for c in " =/"):
                raise ValueError(f"adapter name '{name}' must be non-empty without spaces, '=' or '/'")
        return v

    # -- derived ---------------------------------------------------------------------------------
    def model_names(self) -> list[str]:
        return [self.served_model_name, *self.adapters]

    def interpreter(self) -> Path:
        """Config value, else $VERDICT_VLLM_PYTHON, else .venv-vllm/bin/python (from the cwd, then
        from the checkout this package runs from)."""
        chosen = self.python or os.environ.get(ENV_PYTHON)
        if chosen:
            return Path(chosen)
        local, checkout = Path.cwd() / DEFAULT_PYTHON, source_checkout()
        return local if local.exists() or checkout is None else checkout / DEFAULT_PYTHON

    def adapter_dirs(self) -> dict[str, Path]:
        """Adapter name -> its PEFT adapter folder (a run folder's adapter/), absolute; checked."""

        return {name: adapter_folder(p) for name, p in self.adapters.items()}

    def lora_rank(self) -> int | None:
        """The --max-lora-rank to start with: configured, else derived from the adapters."""
        if not self.adapters:
            return None
        needed = max(adapter_rank(p) for p in self.adapter_dirs().values())
        if self.max_lora_rank is not None:
            if self.max_lora_rank < needed:
                raise ServeConfigError(
                    f"max_lora_rank {self.max_lora_rank} is below the largest adapter rank ({needed})"
                )
            needed = self.max_lora_rank
        return vllm_rank_slot(needed)


def adapter_rank(adapter_dir: Path) -> int:
    """Largest LoRA rank an adapter uses (`r`, and any per-module `rank_pattern` entry)."""
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.is_file():
        raise ServeConfigError(
            f"adapter folder {adapter_dir} has no adapter_config.json (is it a PEFT LoRA adapter?)"
        )
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ServeConfigError(f"cannot read {cfg_path}: {e}") from None
    ranks = [cfg.get("r")] + list((cfg.get("rank_pattern") or {}).values())
    ranks = [r for r in ranks if isinstance(r, int) and r > 0]
    if not ranks:
        raise ServeConfigError(f"{cfg_path} names no LoRA rank ('r')")
    return max(ranks)


def vllm_rank_slot(rank: int) -> int:
    """Smallest rank slot vLLM accepts that holds ``rank``."""
    for slot in VLLM_LORA_RANKS:
        if slot >= rank:
            return slot
    raise ServeConfigError(f"LoRA rank {rank} exceeds the largest rank vLLM serves ({VLLM_LORA_RANKS[-1]})")
