"""An OpenAI-compatible endpoint the formalizer calls (`configs/teachers/NAME.yaml`): an API model, a
LiteLLM gateway, Azure OpenAI, or a vLLM server with a student adapter (then `model` is the adapter
name), with its limits, prices and the egress rule for patient text. Strict: an unknown or
misspelled key is an error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    Field,
    field_validator,
    model_validator,
)
from verdict.core.configs import StrictModel, load_config

from .errors import ConfigError

Stage = Literal["parser", "miner_inclusion", "miner_exclusion", "arbiter", "verbalizer", "reader"]
STAGES: tuple[str, ...] = get_args(Stage)
DataClass = Literal["private", "public", "synthetic"]

# Request fields the formalizer sets itself; extra_params may not override them.
_MANAGED = {
    "messages",
    "model",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "stream",
    "n",
    "seed",
    "extra_body",
}


class Prices(StrictModel):
    """US dollars per million tokens (as providers list them)."""

    input_per_million: float = Field(0.0, ge=0)
    output_per_million: float = Field(0.0, ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million) / 1e6


class StageTokens(StrictModel):
    """Per-stage output token limits (the max_tokens / max_completion_tokens sent)."""

    parser: int = Field(4096, gt=0)
    miner_inclusion: int = Field(2048, gt=0)
    miner_exclusion: int = Field(2048, gt=0)
    arbiter: int = Field(1024, gt=0)
    verbalizer: int = Field(1024, gt=0)
    reader: int = Field(1536, gt=0)  # one chart-reading call: the verbatim excerpts of a passage group

    def for_stage(self, stage: str) -> int:
        return int(getattr(self, stage))


class EndpointConfig(StrictModel):
    name: str = Field(min_length=1)
    description: str = ""
    base_url: str = Field(description="e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1")
    model: str = Field(min_length=1, description="model, deployment (Azure) or adapter (vLLM) name")
    api: Literal["openai", "azure"] = Field("openai", description="azure: AsyncAzureOpenAI with api_version")
    api_version: str | None = Field(None, description="Azure OpenAI api-version (api: azure only)")
    api_key_env: str | None = Field(
        None, description="environment variable holding the key; none for local servers"
    )
    structured_output: Literal["json_schema", "vllm", "json_object", "none"] = Field(
        "json_schema",
        description="json_schema: response_format json_schema (OpenAI, Azure, LiteLLM); vllm: the "
        "`structured_outputs` request field of current vLLM (never the old, silently ignored guided_json); "
        "json_object: JSON mode only; none: prompt only. Every response is validated strictly either way.",
    )
    strict_schema: bool = Field(False, description="send json_schema with strict=true (OpenAI strict mode)")
    limits: str | None = Field(
        None,
        description="configs/limits/NAME.yaml of a local student: max_tokens (its stages), "
        "context_tokens and tokenizer derive from it; setting them to other values too is an error",
    )
    max_tokens: StageTokens = Field(default_factory=StageTokens)
    context_tokens: int | None = Field(
        None,
        gt=0,
        description="the model's context (prompt + completion; vLLM max_model_len): each call's prompt "
        "must fit context_tokens - max_tokens[stage]; null: no prompt limit (large API models)",
    )
    tokenizer: str | None = Field(
        None,
        description="tokenizer.json (or a model folder holding one) to count prompt tokens exactly; "
        "null: a deliberately high byte estimate",
    )
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    temperature: float | None = Field(0.0, ge=0, le=2, description="null for models that reject it")
    seed: int | None = None
    extra_params: dict[str, Any] = Field(
        default_factory=dict, description="more request fields, e.g. reasoning_effort"
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="fields the openai client does not know"
    )
    timeout_s: float = Field(120.0, gt=0)
    concurrency: int = Field(8, ge=1, le=1024)
    max_retries: int = Field(6, ge=0, le=100)
    backoff_base_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    proxy: str | None = Field(None, description="HTTP proxy URL; environment proxies are never used")
    prices: Prices = Field(default_factory=Prices)

    @model_validator(mode="before")
    @classmethod
    def _from_limits(cls, data):
        from .budget import limits_of, student_limit_keys

        limits = limits_of(data)
        return data if limits is None else student_limit_keys(data, (), limits, "teacher config")

    @field_validator("base_url", "proxy")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"must be an http(s) URL with a host (got '{v}')")
        return v

    @field_validator("extra_params")
    @classmethod
    def _not_managed(cls, v: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(set(v) & _MANAGED)
        if clash:
            raise ValueError(f"{', '.join(clash)} are set by the formalizer; use the dedicated config keys")
        return v

    @model_validator(mode="after")
    def _azure_version(self):
        if self.api == "azure" and not self.api_version:
            raise ValueError("api: azure needs api_version")
        return self

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    @property
    def endpoint_id(self) -> str:
        """What identifies the endpoint in cache keys: where it is and which API dialect."""
        return f"{self.api}:{self.base_url.rstrip('/')}"


class EgressConfig(StrictModel):
    allow_loopback: bool = True
    allow_hosts: list[str] = Field(
        default_factory=list, description="hosts, *.suffix wildcards or CIDR blocks"
    )


# The `egress` field of a patient-record source (FHIR REST, OMOP): where it may connect.
SourceEgress = Annotated[
    EgressConfig,
    Field(
        default_factory=EgressConfig,
        description="hosts allowed besides loopback (also $VERDICT_EGRESS_ALLOW)",
    ),
]


def load_teacher(name_or_path: str | Path, overrides: list[str] | None = None) -> EndpointConfig:
    """configs/teachers/NAME.yaml (or a path); ``overrides`` as ``--set key=value``."""
    return load_config("teachers", EndpointConfig, name_or_path, overrides, ConfigError, "teacher")[1]
