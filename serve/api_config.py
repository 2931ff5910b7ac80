"""What the matching service is started with: where its formalizers are, the site allowlist for
patient text, the audit store and key file, limits and failure behaviour. Strict: an unknown key is
an error naming it. Relative paths are taken from the directory the service runs in.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from data_gen.teacher_config import EgressConfig, StageTokens, TeacherConfig

from .protocol import POLICY_NAME


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FormalizerConfig(_Strict):
    """The students behind the service: one OpenAI-compatible server (vLLM) with two adapters."""

    base_url: str | None = Field(
        None,
        description="e.g. http://127.0.0.1:8011/v1; default: the `vllm` section of the same serve config",
    )
    parser_model: str = Field("parser", description="model (adapter) name of the trial parser")
    value_miner_model: str = Field("value_miner", description="model (adapter) name of the value miner")
    api_key_env: str | None = Field(
        None, description="environment variable with the server's key, if it has one"
    )
    prompts: dict[str, str] = Field(
        default_factory=dict, description="prompt version per stage (data_gen/prompts), default v1"
    )
    max_tokens: StageTokens = Field(
        default_factory=lambda: StageTokens(parser=2048, miner_inclusion=1024, miner_exclusion=1024)
    )
    timeout_s: float = Field(60.0, gt=0, description="a call slower than this answers 503 (formalizer slow)")
    concurrency: int = Field(
        16, ge=1, le=1024, description="requests in flight towards the server, all stages"
    )

    def endpoint(self, stage_model: str, base_url: str) -> TeacherConfig:
        """The data_gen endpoint config of one adapter. No retries here: a down or slow formalizer is
        answered at once with 503 + Retry-After, and the caller decides when to try again."""
        return TeacherConfig(
            name=f"student:{stage_model}",
            base_url=base_url,
            model=stage_model,
            api_key_env=self.api_key_env,
            structured_output="vllm",
            max_tokens=self.max_tokens,
            temperature=0.0,
            timeout_s=self.timeout_s,
            concurrency=self.concurrency,
            max_retries=0,
        )


class Limits(_Strict):
    max_body_bytes: int = Field(1_000_000, ge=1024, description="larger request bodies get 413")
    max_batch_pairs: int = Field(1000, ge=1, description="patients x trials in one /v1/match/batch request")
    batch_concurrency: int = Field(8, ge=1, description="pairs of one batch computed at the same time")


class ApiConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535, description="0 = a free port")
    formalizer: FormalizerConfig = Field(default_factory=FormalizerConfig)
    egress: EgressConfig = Field(default_factory=EgressConfig, description="where patient text may go")
    audit_db: str = Field("runs/serve/audit.sqlite", description="append-only audit store (SQLite)")
    store_notes: bool = Field(
        True,
        description="keep notes in the audit store (for evidence in context); false keeps only their hash",
    )
    api_keys: str = Field("runs/serve/api_keys.json", description="hashed API keys (verdict serve keys add)")
    default_policy: str = "prescreen"
    solver_timeout_ms: int = Field(5000, ge=1, description="per solver call; a timeout gives `undetermined`")
    alternatives: int = Field(2, ge=0, description="extra minimum pivotal sets to enumerate")
    retry_after_s: int = Field(30, ge=1, description="Retry-After sent with 503 when the formalizer is down")
    limits: Limits = Field(default_factory=Limits)
    log_file: str | None = Field(None, description="service log; default: stderr")

    @field_validator("default_policy")
    @classmethod
    def _policy_name(cls, v: str) -> str:
        if not re.fullmatch(POLICY_NAME, v):
            raise ValueError(f"'{v}' is not a policy name (configs/policies/NAME.yaml)")
        return v
