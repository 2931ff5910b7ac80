"""The run directory: everything a training run leaves behind, in one place.

<output_dir>/<name>/
  config.yaml        resolved config (absolute paths)
  run_info.json      status, code version, library versions, dataset fingerprints and counts,
                     resumed-from, final metrics
  checkpoints/       trainer checkpoints (a killed run resumes from the last one)
  tensorboard/       training curves (`tensorboard --logdir RUN/tensorboard`)
  adapter/           the LoRA adapter + tokenizer + README.md model card
  merged/            base with the adapter merged in (only with `merge: true` / `verdict train merge`)
  eval/<dataset>/<split>/   predictions.jsonl, report.json, report.md (`verdict train eval`)
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from verdict.core import configs
from verdict.core.errors import VerdictError

if TYPE_CHECKING:
    from .sft_config import TrainConfig

CODE_ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("torch", "transformers", "peft", "trl", "datasets", "accelerate", "verdict-onsite")


class RunError(VerdictError):
    """A run directory is missing, incomplete, or holds a different run."""


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def info(self) -> Path:
        return self.path / "run_info.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def adapter(self) -> Path:
        return self.path / "adapter"

    @property
    def merged(self) -> Path:
        return self.path / "merged"

    def eval_dir(self, dataset_label: str, split: str) -> Path:
        return self.path / "eval" / dataset_label.replace("/", "__") / split

    def read_info(self) -> dict:
        if not self.info.is_file():
            return {}
        return json.loads(self.info.read_text())

    def write_info(self, **updates) -> dict:
        info = {**self.read_info(), **updates}
        write_atomic(self.info, json.dumps(info, indent=2, sort_keys=True) + "\n")
        return info

    def read_config(self) -> TrainConfig:
        """The run's resolved config, strict: a key TrainConfig does not declare is an error."""
        from .sft_config import TrainConfig

        if not self.config.is_file():
            raise RunError(f"'{self.path}' is not a training run (no config.yaml)")
        return configs.load(TrainConfig, self.config, None, f"run config {self.config}", RunError)


def open_run(path: str | os.PathLike) -> RunDir:
    run = RunDir(Path(path))
    if not run.path.is_dir():
        raise RunError(f"run directory '{path}' does not exist")
    run.read_config()
    return run


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file + rename, so a killed process never leaves half a file. The file is 0600
    (mkstemp's mode): the key file and the ready file rely on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def code_version() -> str:
    """`git describe` of the checkout this code runs from, else the installed package version."""
    try:
        out = subprocess.run(
            ["git", "-C", str(CODE_ROOT), "describe", "--always", "--dirty", "--tags"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            return "git:" + out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return "package:" + metadata.version("verdict-onsite")
    except metadata.PackageNotFoundError:
        return "unknown"


def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out
