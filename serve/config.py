"""A serve config, `configs/serve/NAME.yaml`: one deployment, with a `vllm` section (the student
server) and an `api` section (the matching service in front of it). Either may be absent: a site
that runs vLLM on another host has only `api`, with `api.formalizer.base_url` set.

Loaded with the project's one strict-config loader (`verdict.core.configs`): unknown keys, in the file
or in `--set a.b=value` overrides, are errors that name the key and suggest the closest one. Relative
paths are taken from the config's `root` (see `site_paths`), never from the working directory.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from verdict.core import configs
from verdict.core.configs import StrictModel, find_config
from verdict.core.errors import VerdictError
from verdict.data_gen.formalizer import derive_limits, limits_of, student_limit_keys

from .api_config import ApiConfig
from .errors import ServeConfigError
from .site_paths import config_root, resolve_paths
from .vllm.config import VLLMConfig


class ServeConfig(StrictModel):
    name: str = ""
    description: str = ""
    root: str | None = Field(
        None,
        description="folder every relative path of this config is taken from (a relative root: from the "
        "config file's folder); default: the config file's folder",
    )
    source: str | None = Field(None, description="the config file this was loaded from (set by the loader)")
    limits: str | None = Field(
        None,
        description="configs/limits/NAME.yaml: vllm.max_model_len and api.formalizer's max_tokens, "
        "context_tokens and tokenizer derive from it (a contradicting value is an error)",
    )
    vllm: VLLMConfig | None = None
    api: ApiConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_limits(cls, data):

        limits = limits_of(data)
        if limits is None:
            return data
        if data.get("vllm") is not None:
            data = derive_limits(data, {("vllm", "max_model_len"): limits.max_length}, limits, "serve config")
        if data.get("api") is not None:
            base = (data.get("vllm") or {}).get("model") if isinstance(data.get("vllm"), dict) else None
            data = student_limit_keys(data, ("api", "formalizer"), limits, "serve config", base_model=base)
        return data

    @model_validator(mode="after")
    def _api_has_a_formalizer(self):
        if self.api is not None and not self.api.formalizer.configured_urls and self.vllm is None:
            raise ValueError(
                "api.formalizer.base_url is required (or base_urls) when the config has no vllm section"
            )
        return self

    @model_validator(mode="after")
    def _model_files_from_vllm(self):
        # The folders vLLM serves are the ones a decision's record pins, unless the api names others.
        if self.api is not None and self.vllm is not None and not self.api.formalizer.model_files:
            self.api.formalizer.model_files = {
                self.vllm.served_model_name: self.vllm.model,
                **self.vllm.adapters,
            }
        return self

    def require(self, section: str):
        value = getattr(self, section)
        if value is None:
            raise ServeConfigError(f"serve config '{self.name}' has no '{section}' section")
        return value


def load_serve_config(name_or_path: str | Path, overrides: list[str] | None = None) -> ServeConfig:
    """configs/serve/NAME.yaml (or a path), with `a.b=value` overrides applied."""

    try:
        path = find_config("serve", name_or_path)
        data = configs.read_yaml(path)
        data.setdefault("name", path.stem)
        data = configs.apply_overrides(data, overrides or [], ServeConfig)
        root = config_root(path, data.get("root"))
        data = {**resolve_paths(data, root), "root": str(root), "source": str(path.resolve())}
        return configs.build(ServeConfig, data, None, where=f"serve config {path.name}")
    except ServeConfigError:
        raise
    except VerdictError as e:
        raise ServeConfigError(e.summary, e.problems) from None
