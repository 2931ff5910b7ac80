"""Where a serve config's files are: relative paths taken from the config's `root`, and adapters
given as training run folders.

Every relative path of a serve config (in the file or in a `--set`) is taken from its `root`; a
relative `root` is taken from the folder of the config file, and its default is that folder. So a
config means the same files whichever directory a command runs in (the API started elsewhere does
not create a second, empty audit store). The shipped configs say `root: ../..`: in a checkout that is
the checkout itself, where `verdict train` and the demo write.

An adapter (`vllm.adapters`) may be a PEFT adapter folder or a training run folder (what `verdict
train` writes, `<output_dir>/<name>`): a run must have completed (`run_info.json` status) and its
`adapter/` is used.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ServeConfigError

# dotted keys of a serve config that name files or folders (vllm.adapters: every value)
PATH_KEYS = (
    ("vllm", "model"),
    ("vllm", "python"),
    ("vllm", "log_file"),
    ("api", "audit_db"),
    ("api", "api_keys"),
    ("api", "log_file"),
    ("api", "tls", "certfile"),
    ("api", "tls", "keyfile"),
)
# keys whose default (when the file omits them) is a relative path: resolved like the others
PATH_DEFAULTS = {
    ("api", "audit_db"): "runs/serve/audit.sqlite",
    ("api", "api_keys"): "runs/serve/api_keys.json",
}
ADAPTER_CONFIG = "adapter_config.json"
RUN_INFO = "run_info.json"


def config_root(config_file: Path, root: str | None) -> Path:
    """The folder relative paths are taken from: ``root`` (itself relative to the config's folder)."""
    folder = config_file.resolve().parent
    return (folder / root).resolve() if root else folder


def _absolute(value: str, root: Path) -> str:
    if "://" in value:  # a URL (postgresql://...), not a path
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (root / p).resolve())


def resolve_paths(data: dict, root: Path) -> dict:
    """``data`` (a serve config as a dict) with every path key made absolute against ``root``."""
    out = json.loads(json.dumps(data))  # a deep copy of plain YAML data
    for keys in PATH_KEYS:
        section = out.get(keys[0])
        if not isinstance(section, dict):
            continue
        node = section
        for k in keys[1:-1]:
            node = node.get(k) if isinstance(node.get(k), dict) else None
            if node is None:
                break
        if node is None:
            continue
        value = node.get(keys[-1], PATH_DEFAULTS.get(keys))
        if isinstance(value, str) and value:
            node[keys[-1]] = _absolute(value, root)
    vllm = out.get("vllm")
    if isinstance(vllm, dict) and isinstance(vllm.get("adapters"), dict):
        vllm["adapters"] = {n: _absolute(str(p), root) for n, p in vllm["adapters"].items()}
    formalizer = (out.get("api") or {}).get("formalizer") if isinstance(out.get("api"), dict) else None
    if isinstance(formalizer, dict) and isinstance(formalizer.get("model_files"), dict):
        formalizer["model_files"] = {n: _absolute(str(p), root) for n, p in formalizer["model_files"].items()}
    return out


def adapter_folder(path: str | Path) -> Path:
    """The PEFT adapter folder that ``path`` names: the folder itself, or the `adapter/` of a
    completed training run. Errors say what the folder is and what it lacks, with its absolute path."""
    p = Path(path).resolve()
    if not p.exists():
        raise ServeConfigError(f"adapter folder {p} does not exist")
    if not p.is_dir():
        raise ServeConfigError(f"adapter {p} is not a folder")
    if (p / ADAPTER_CONFIG).is_file():
        return p
    if (p / RUN_INFO).is_file() or (p / "config.yaml").is_file():
        try:
            status = json.loads((p / RUN_INFO).read_text()).get("status")
        except (OSError, ValueError):
            status = None
        if status != "completed":
            raise ServeConfigError(
                f"training run {p} has not completed (run_info.json status: {status or 'none'}); "
                "finish it with the same `verdict train --config ...` command"
            )
        if not (p / "adapter" / ADAPTER_CONFIG).is_file():
            raise ServeConfigError(f"training run {p} completed but has no adapter/{ADAPTER_CONFIG}")
        return p / "adapter"
    raise ServeConfigError(
        f"{p} is neither a LoRA adapter folder (no {ADAPTER_CONFIG}) nor a training run folder "
        f"(no {RUN_INFO}): give the run folder `verdict train` wrote (<output_dir>/<name>)"
    )
