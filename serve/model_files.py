"""The model files behind a decision, pinned by content: every decision's audit record names the
base model and each adapter the formalizer served with a hash of their files (`models.files`).

Why: a name ("value_miner") says which adapter was asked, not which weights answered; a retrained or
copied-over adapter under the same name would make two decisions look alike. vLLM has also had
prefix-cache bugs across reloaded LoRA adapters: the hash tells which weights a cached prefix met.

The folders come from `api.formalizer.model_files` (served name -> folder; by default the `vllm`
section of the same serve config). They are hashed once, in a background thread started with the
service (a 7B base model takes about a minute from a fast disk; the tiny test models milliseconds);
the first decision recorded waits for it. A folder that cannot be read is recorded as such, never
silently left out.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from .site_paths import adapter_folder

_CHUNK = 1 << 20


def folder_digest(folder: Path) -> str:
    """sha256 over every file below `folder` (hidden files aside), each as its relative path and its
    own sha256, in path order: the same files give the same digest wherever the folder lies."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        one = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                one.update(chunk)
        h.update(f"{f.relative_to(folder).as_posix()}\0{one.hexdigest()}\n".encode())
    return "sha256:" + h.hexdigest()


def pin(path: str) -> str:
    """The digest of a model folder (a training run folder stands for its adapter/), or why not."""

    p = Path(path)
    try:
        if (p / "run_info.json").exists() or (p / "adapter_config.json").exists():
            p = adapter_folder(p)  # a training run folder stands for its adapter/, once completed
        if not p.is_dir():
            return f"unavailable: {p.resolve()} is not a folder"
        return folder_digest(p)
    except Exception as e:  # noqa: BLE001 - a pin that fails is recorded as such, the service runs on
        return f"unavailable: {type(e).__name__}: {e}"[:300]


class ModelFiles:
    """Served model name -> digest of its files, computed once in the background."""

    def __init__(self, folders: dict[str, str]):
        self._folders = dict(folders)
        self._pins: dict[str, str] = {}
        self._thread = threading.Thread(target=self._compute, name="model-files", daemon=True)
        self._thread.start()

    def _compute(self) -> None:
        self._pins = {name: pin(path) for name, path in sorted(self._folders.items())}

    def pins(self) -> dict[str, str]:
        """The digests (blocks until they are computed: call it off the event loop)."""
        self._thread.join()
        return dict(self._pins)
