"""The project's one config loader: find a config by name or path, read its YAML, apply
``--set key=value`` overrides, and validate it into a strict model.

Every config kind (policies, teachers, teacher runs, prompts, train, eval, slurm, serve, bench,
recipes, limits, FHIR code maps, scripted-server scripts, run directories) goes through here:
YAML -> dict -> dotted overrides -> a `StrictModel`. An unknown key, in the file or in an
override, is an error that names it and suggests the closest known one.

Search order for ``NAME`` of kind ``KIND``: an existing path; ``$VERDICT_CONFIG_DIR/KIND/NAME.yaml``
(a site's own configs folder, also set by ``verdict --config-dir``); the shipped configs, which are
package data (``verdict.configs``). Never the working directory: which file a name means does not
depend on where a command runs.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import VerdictError


def shipped(package: str, *parts: str) -> Path:
    """A folder or file of the package data: ``shipped("configs", "policies")`` or
    ``shipped("examples", "cases")``, from the wheel or, in an editable install, the checkout."""
    return Path(str(resources.files(f"verdict.{package}").joinpath(*parts)))


def source_checkout() -> Path | None:
    """The project checkout this code runs from (an editable install), or None (a wheel). Only for
    what exists only in a checkout: its git version, its `.venv-vllm`, its `.cache`."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "verdict_core").is_dir() else None


class StrictModel(BaseModel):
    """The one strict base: a key the model does not declare is an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid")


class ConfigError(VerdictError):
    """A config file or override is missing, malformed, names an unknown key, or has a bad value."""


M = TypeVar("M", bound=BaseModel)


# ---- finding ------------------------------------------------------------------------------------
def config_dirs(kind: str) -> list[Path]:
    dirs = []
    if os.environ.get("VERDICT_CONFIG_DIR"):
        dirs.append(Path(os.environ["VERDICT_CONFIG_DIR"]) / kind)
    dirs.append(shipped("configs", kind))
    return dirs


def find_config(
    kind: str,
    name_or_path: str | os.PathLike,
    error: type[VerdictError] = ConfigError,
    dirs: Sequence[Path] | None = None,
) -> Path:
    """The file of config ``name_or_path`` of ``kind``: a path as given, else NAME.yaml in ``dirs``
    (default: the kind's config folders). An unknown name is ``error``, with a did-you-mean."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json"):
        if p.is_file():
            return p
        if p.parent != Path("."):  # a path, not a name: say so rather than search the folders
            raise error(f"{kind} config file '{p}' does not exist")
    dirs = list(dirs) if dirs is not None else config_dirs(kind)
    for d in dirs:
        for ext in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{ext}"
            if cand.is_file():
                return cand
    known = _names(dirs)
    raise error(f"no {kind} config named '{name_or_path}'{suggest(str(name_or_path), known, 'known')}")


def available(kind: str) -> list[str]:
    return _names(config_dirs(kind))


def _names(dirs: Sequence[Path]) -> list[str]:
    return sorted({f.stem for d in dirs if d.is_dir() for f in d.glob("*.y*ml")})


def closest(key: str, known: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the closest of ``known``, else ''."""
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def suggest(key: str, known: Sequence[str], label: str = "known keys") -> str:
    """' (did you mean 'x'?)' for the closest of ``known``, else the list of them."""
    return closest(key, known) or f" ({label}: {', '.join(sorted(known)) or 'none'})"


# ---- reading ------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """YAML without 1.1's base-60 numbers: ``time: 10:00:00`` stays the string sbatch expects
    instead of becoming 36000."""


_Loader.yaml_implicit_resolvers = {
    ch: [
        (tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def yaml_load(text: str | bytes):
    return yaml.load(text, Loader=_Loader)  # safe: _Loader is a SafeLoader subclass


def read_yaml(path: str | os.PathLike, error: type[VerdictError] = ConfigError) -> dict:
    """A config file's mapping (an empty file is ``{}``)."""
    p = Path(path)
    if not p.is_file():
        raise error(f"config file '{p}' does not exist")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise error(f"cannot read config file '{p}': {e.strerror or e}") from None
    return parse_yaml(raw, f"config file '{p}'", error)


def parse_yaml(text: str | bytes, source: str, error: type[VerdictError] = ConfigError) -> dict:
    """The mapping in ``text`` (read from ``source``, which errors name)."""
    try:
        data = yaml_load(text)
    except yaml.YAMLError as e:
        raise error(f"{source} is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise error(f"{source} must hold a mapping of keys to values")
    return data


# ---- overrides ----------------------------------------------------------------------------------
def parse_override(item: str) -> tuple[list[str], Any]:
    """'lora.r=16' -> (['lora', 'r'], 16). The value is read as a YAML scalar or flow collection."""
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not KEY=VALUE (e.g. --set lr=1e-3)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override '{item}': empty key")
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: Sequence[str], model: type[BaseModel]) -> dict:
    """Set dotted keys in ``data``; a key that the model does not declare is refused by name."""
    data = dict(data)
    for item in overrides:
        path, value = parse_override(item)
        _check_path(model, path, item)
        node = data
        for p in path[:-1]:
            child = node.get(p)
            child = dict(child) if isinstance(child, dict) else {}
            node[p] = child
            node = child
        node[path[-1]] = value
    return data


def _check_path(model: type[BaseModel], path: list[str], item: str) -> None:
    cls: Any = model
    for i, p in enumerate(path):
        fields = getattr(cls, "model_fields", None)
        if fields is None:
            raise ConfigError(f"override '{item}': '{'.'.join(path[:i])}' has no sub-keys")
        if p not in fields:
            raise ConfigError(f"unknown config key '{'.'.join(path[: i + 1])}'{suggest(p, list(fields))}")
        cls = _model_in(fields[p].annotation)


def _model_in(ann: Any) -> Any:
    """The BaseModel class inside an annotation like ``LoraSpec``, ``LoraSpec | None`` or
    ``list[Rule]`` / ``dict[str, Action]``."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()) or ():
        found = _model_in(a)
        if found is not None:
            return found
    return None


# ---- validating ---------------------------------------------------------------------------------
def describe(err: ValidationError, model: type[BaseModel]) -> list[str]:
    """Pydantic errors as 'key: problem' lines; unknown keys get a did-you-mean."""
    lines = []
    for e in err.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            parent: Any = model
            for p in e["loc"][:-1]:
                fields = getattr(parent, "model_fields", None) or {}
                if isinstance(p, str) and p in fields:  # a dict key or list index keeps the value's model
                    parent = _model_in(fields[p].annotation)
            known = (
                list(parent.model_fields) if parent is not None and hasattr(parent, "model_fields") else []
            )
            lines.append(f"unknown config key '{loc}'{suggest(str(e['loc'][-1]), known) if known else ''}")
        elif not loc:  # a whole-config check (e.g. limits): the message names its keys
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"{loc}: {e['msg']}")
    return list(dict.fromkeys(lines))


def build(
    model: type[M],
    data: dict,
    overrides: Sequence[str] | None = None,
    where: str = "config",
    error: type[VerdictError] = ConfigError,
) -> M:
    """``data`` with ``overrides`` applied, validated into ``model``; problems raise ``error``."""
    try:
        data = apply_overrides(data, overrides or [], model)
    except ConfigError as e:
        if error is ConfigError:
            raise
        raise error(str(e)) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise error(f"invalid {where}", describe(e, model)) from None


def load(
    model: type[M],
    path: str | os.PathLike,
    overrides: Sequence[str] | None = None,
    where: str | None = None,
    error: type[VerdictError] = ConfigError,
) -> M:
    """The config file at ``path`` (a path, not a name) as ``model``."""
    return build(model, read_yaml(path, error), overrides, where or f"config {Path(path).name}", error)


def load_config(
    kind: str,
    model: type[M],
    name_or_path: str | os.PathLike,
    overrides: Sequence[str] | None = None,
    error: type[VerdictError] = ConfigError,
    what: str | None = None,
) -> tuple[Path, M]:
    """Config ``name_or_path`` of ``kind`` (found as `find_config` does) as ``model``, with its path."""
    path = find_config(kind, name_or_path, error)
    return path, load(model, path, overrides, f"{what or kind} config {path.name}", error)
