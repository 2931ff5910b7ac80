"""Versioned prompt templates (`data_gen/formalizer/prompts/<name>.<version>.yaml`).

A template is a system text and a user text with `{{PLACEHOLDER}}` slots (the paper's notation).
Its identity, `name@version#sha`, is part of every cache key, so a changed wording never reuses
an old answer; `prompts/LOCK.json` pins each version's hash so that an edit without a new
version is caught by the tests.

A value-miner template declares its output form: `dense` (v1: a line for every asked atom, nulls
included) or `sparse` (v2, the default: only the atoms the text establishes; one left out is null).
`DEFAULT_VERSIONS` is the version a stage uses when a config names none.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from verdict.core.configs import StrictModel, build, find_config, parse_yaml

from .errors import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
_SLOT = re.compile(r"\{\{([A-Z_]+)\}\}")
# Which template each stage uses.
STAGE_TEMPLATE = {
    # one criterion per call; trial_parser (whole trial) is kept for old records
    "parser": "criterion_parser",
    "miner_inclusion": "miner_inclusion",
    "miner_exclusion": "miner_exclusion",
    "arbiter": "arbiter",
    "verbalizer": "verbalizer",
    "reader": "reader",
}
# The version a stage uses when its config names none: the miners answer sparsely (v2), the reader
# tags its excerpts with terms (v2); v1 stays for the records and cache entries made with it.
DEFAULT_VERSIONS = {"miner_inclusion": "v2", "miner_exclusion": "v2", "reader": "v2"}


def default_version(stage: str) -> str:
    """The prompt version of `stage` when a config names none."""
    return DEFAULT_VERSIONS.get(stage, "v1")


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    version: str
    stage: str
    system: str
    user: str
    sha256: str
    output: str = "dense"

    @property
    def sparse(self) -> bool:
        """A value miner that reports only the atoms the text establishes (omitted ones are null)."""
        return self.output == "sparse"

    @property
    def ident(self) -> str:
        """`name@version`: what datasets and cards record."""
        return f"{self.name}@{self.version}"

    @property
    def slots(self) -> set[str]:
        return set(_SLOT.findall(self.system)) | set(_SLOT.findall(self.user))

    def render(self, **values: str) -> list[dict[str, str]]:
        """Chat messages with every slot filled; a missing or unknown slot is an error."""
        missing = self.slots - set(values)
        unknown = set(values) - self.slots
        if missing or unknown:
            raise ConfigError(
                f"prompt {self.ident}: slots missing {sorted(missing)} / not in template {sorted(unknown)}"
            )
        # One pass over the template: values are never re-scanned, so text in them that looks like
        # a slot stays as it is.
        fill = lambda text: _SLOT.sub(lambda m: values[m.group(1)], text)  # noqa: E731
        msgs = []
        if self.system.strip():
            msgs.append({"role": "system", "content": fill(self.system).strip()})
        msgs.append({"role": "user", "content": fill(self.user).strip()})
        return msgs


def available() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in sorted(PROMPTS_DIR.glob("*.yaml")):
        name, _, version = f.stem.rpartition(".")
        out.setdefault(name, []).append(version)
    return out


def load_prompt(name: str, version: str = "v1") -> PromptTemplate:
    return _load(name, version)


class PromptFile(StrictModel):
    """`data_gen/formalizer/prompts/NAME.VERSION.yaml`."""

    name: str
    version: str
    stage: str
    system: str | None = ""
    user: str
    output: Literal["dense", "sparse"] = "dense"


@lru_cache(maxsize=64)
def _load(name: str, version: str) -> PromptTemplate:
    path = find_config("prompt", f"{name}.{version}", ConfigError, dirs=[PROMPTS_DIR])
    raw = path.read_bytes()  # parsed and hashed as one read: the hash is of the text in use
    where = f"prompt file {path.name}"
    data = build(PromptFile, parse_yaml(raw, where, ConfigError), where=where, error=ConfigError)
    if data.name != name or data.version != version:
        raise ConfigError(f"prompt file {path.name} declares {data.name}.{data.version}")
    return PromptTemplate(
        name=name,
        version=version,
        stage=data.stage,
        system=data.system or "",
        user=data.user,
        sha256=hashlib.sha256(raw).hexdigest(),
        output=data.output,
    )


def stage_prompt(stage: str, version: str | None = None) -> PromptTemplate:
    """The template of `stage` at `version` (None: `default_version`)."""
    return load_prompt(STAGE_TEMPLATE[stage], version or default_version(stage))


def lock() -> dict[str, str]:
    """The recorded hash of every template version (prompts/LOCK.json)."""
    return json.loads((PROMPTS_DIR / "LOCK.json").read_text())


def current_hashes() -> dict[str, str]:
    return {f"{n}@{v}": load_prompt(n, v).sha256 for n, vs in available().items() for v in vs}
