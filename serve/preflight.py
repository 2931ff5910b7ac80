"""Checks before anything slow starts (`verdict serve vllm|up`, `verdict slurm render-serve`): every
missing input listed in one run, with absolute paths; `device: gpu` refused on a machine without
CUDA, with the GPU memory the config needs (`gpu_sizing`); the API's address free before vLLM
spends minutes loading a model.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

from .errors import ServeConfigError
from .site_paths import adapter_folder
from .vllm.config import VLLMConfig
from .vllm.gpu_sizing import VLLM_DEFAULT_MAX_NUM_SEQS, Estimate, estimate


class PreflightError(ServeConfigError):
    """The deployment cannot start: what is missing or wrong, every item named."""


def missing_inputs(cfg: VLLMConfig) -> list[str]:
    """Every input of the vLLM server that is absent, one line each (empty: all there)."""
    problems = []
    python = cfg.interpreter()
    if not python.exists():
        problems.append(
            f"vLLM interpreter {python.absolute()} does not exist: run scripts/setup.sh (creates "
            ".venv-vllm), or set `vllm.python` in the serve config or $VERDICT_VLLM_PYTHON"
        )
    model = Path(cfg.model).absolute()
    if not model.exists():
        problems.append(f"base model folder {model} does not exist")
    elif not (model / "config.json").is_file():
        problems.append(f"base model folder {model} has no config.json (is it a Hugging Face model folder?)")

    for name, path in cfg.adapters.items():
        try:
            adapter_folder(path)
        except ServeConfigError as e:
            problems.append(f"adapter '{name}': {e.summary}")
    return problems


def cuda_devices() -> list[int] | None:
    """Total memory (bytes) of each CUDA GPU `nvidia-smi` lists; None when there is no NVIDIA driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [] if Path("/dev/nvidiactl").exists() else None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [int(float(v)) * 1024**2 for v in out.stdout.split() if v.strip()]


def memory_needed(cfg: VLLMConfig) -> Estimate | None:
    """The formula of `gpu_sizing` for this config; None when the model folder has no config.json."""
    try:
        mc = json.loads((Path(cfg.model) / "config.json").read_text())

        adapters = [
            json.loads((adapter_folder(p) / "adapter_config.json").read_text()) for p in cfg.adapters.values()
        ]
        rank = cfg.lora_rank()
        return estimate(
            mc.get("text_config", mc),
            cfg.dtype,
            adapters,
            cfg.max_model_len,
            cfg.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS,
            max_lora_rank=rank,
        )
    except (OSError, ValueError, KeyError, ServeConfigError):
        return None


def gpu_problems(cfg: VLLMConfig) -> list[str]:
    """`device: gpu` on a machine without CUDA, or with GPUs smaller than the config needs."""
    if cfg.device != "gpu":
        return []
    need = memory_needed(cfg)
    need_text = f"the config needs about {need.text()} of GPU memory" if need else "(model not readable)"
    gpus = cuda_devices()
    if not gpus:
        return [
            "device: gpu, but this machine has no CUDA GPU (no working nvidia-smi); "
            f"{need_text}. Run it on a GPU node, or use --set vllm.device=cpu with a CPU vLLM"
        ]
    usable = max(gpus) * cfg.gpu_memory_utilization * cfg.tensor_parallel_size
    if need and need.total > usable:
        return [
            f"{need_text}, more than gpu_memory_utilization {cfg.gpu_memory_utilization} of the largest "
            f"GPU here ({max(gpus) / 1024**3:.0f} GiB): lower vllm.max_num_seqs or max_model_len"
        ]
    return []


def check_vllm(cfg: VLLMConfig) -> None:
    """Raise PreflightError listing every problem of the vLLM side."""
    problems = missing_inputs(cfg) + gpu_problems(cfg)
    if problems:
        raise PreflightError("cannot start vLLM", problems)


def check_address(host: str, port: int, what: str = "matching API") -> None:
    """Refuse an address another process holds, naming host and port."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise PreflightError(
                f"the {what} cannot listen on {host}:{port}: {e.strerror or e} (another process holds it? "
                f"`ss -ltnp 'sport = :{port}'` shows which; or choose another with --set api.port=N)"
            ) from None
