"""Loading strict YAML configs with command-line overrides (``--set lr=1e-3 --set lora.r=16``).

One implementation for every config of train/ and slurm/: YAML -> dict -> dotted overrides -> a
Pydantic model with ``extra="forbid"``. Unknown keys (in the file or in an override) are errors
that name the key and suggest the closest known one.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from verdict_core.errors import VerdictError

M = TypeVar("M", bound=BaseModel)


class ConfigError(VerdictError):
    """A config file or override is malformed, names an unknown key, or has a bad value."""


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


def yaml_load(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


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


def apply_overrides(data: dict, overrides: list[str], model: type[BaseModel]) -> dict:
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
            raise ConfigError(f"unknown config key '{'.'.join(path[: i + 1])}'{_suggest(p, list(fields))}")
        ann = fields[p].annotation
        cls = _model_in(ann)


def _model_in(ann: Any) -> Any:
    """The BaseModel class inside an annotation like ``LoraSpec`` or ``LoraSpec | None``."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()) or ():
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(sorted(known))})"


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
            lines.append(f"unknown config key '{loc}'{_suggest(str(e['loc'][-1]), known) if known else ''}")
        elif not loc:  # a whole-config check (e.g. limits): the message names its keys
            lines.append(e["msg"].removeprefix("Value error, "))
        else:
            lines.append(f"{loc}: {e['msg']}")
    return lines


def read_yaml(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file '{p}' does not exist")
    try:
        data = yaml_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{p}' is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{p}' must hold a mapping of keys to values")
    return data


def build(model: type[M], data: dict, overrides: list[str] | None = None, where: str = "config") -> M:
    data = apply_overrides(data, overrides or [], model)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"invalid {where}", describe(e, model)) from None


def load(model: type[M], path: str | os.PathLike, overrides: list[str] | None = None) -> M:
    return build(model, read_yaml(path), overrides, where=f"config {Path(path).name}")
