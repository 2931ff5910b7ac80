"""Finding config files (policies, teachers, runs, ...) by name or path.

Search order for ``NAME`` of kind ``KIND``: an existing path; ``$VERDICT_CONFIG_DIR/KIND/NAME.yaml``;
``./configs/KIND/NAME.yaml``; the ``configs/`` folder of the checkout this package runs from.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import VerdictError

REPO_ROOT = Path(__file__).resolve().parent.parent


def config_dirs(kind: str) -> list[Path]:
    dirs = []
    if os.environ.get("VERDICT_CONFIG_DIR"):
        dirs.append(Path(os.environ["VERDICT_CONFIG_DIR"]) / kind)
    dirs.append(Path.cwd() / "configs" / kind)
    dirs.append(REPO_ROOT / "configs" / kind)
    return dirs


def find_config(kind: str, name_or_path: str | os.PathLike) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") and p.exists():
        return p
    for d in config_dirs(kind):
        for ext in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{ext}"
            if cand.exists():
                return cand
    known = sorted({f.stem for d in config_dirs(kind) if d.is_dir() for f in d.glob("*.y*ml")})
    raise VerdictError(f"no {kind} config named '{name_or_path}' (known: {', '.join(known) or 'none'})")


def available(kind: str) -> list[str]:
    return sorted({f.stem for d in config_dirs(kind) if d.is_dir() for f in d.glob("*.y*ml")})
