"""What the matching service is started with: where its formalizers are, the site allowlist for
patient text, the audit store and key file, limits and failure behaviour. Strict: an unknown key is
an error naming it. Relative paths are taken from the directory the service runs in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from verdict.core.configs import StrictModel
from verdict.core.solver_pool import SolverPool
from verdict.data_gen.formalizer import ChartReading, EgressConfig, EndpointConfig, StageTokens

from .pages.session import SessionConfig
from .protocol import POLICY_NAME, base_url_problem, checked_base_url


class FormalizerConfig(StrictModel):
    """The students behind the service: OpenAI-compatible servers (vLLM) with two adapters."""

    base_url: str | None = Field(
        None,
        description="e.g. http://127.0.0.1:8011/v1; default: the `vllm` section of the same serve config",
    )
    base_urls: list[str] = Field(
        default_factory=list,
        description="several servers with the same adapters (one vLLM per GPU or node), instead of "
        "base_url: least-busy healthy one first, one failover to another on a connection error, "
        "timeout or 5xx",
    )
    health_check_interval_s: float = Field(
        5.0, gt=0, le=3600, description="how often an endpoint marked down is checked again (GET /models)"
    )
    health_check_timeout_s: float = Field(3.0, gt=0, le=60, description="one health check's time limit")
    model_files: dict[str, str] = Field(
        default_factory=dict,
        description="served model name -> local folder of its files (the base model, each adapter or its "
        "training run folder): their content hashes go into every decision's audit record "
        "(models.files). Default: the `vllm` section of the same serve config",
    )
    parser_model: str = Field("parser", description="model (adapter) name of the trial parser")
    value_miner_model: str = Field("value_miner", description="model (adapter) name of the value miner")
    api_key_env: str | None = Field(
        None, description="environment variable with the server's key, if it has one"
    )
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description="prompt version per stage (data_gen/formalizer/prompts); default v2 for the value miners "
        "(sparse answers), v1 for the others",
    )
    max_tokens: StageTokens = Field(
        default_factory=lambda: StageTokens(parser=2048, miner_inclusion=1024, miner_exclusion=1024)
    )
    context_tokens: int | None = Field(
        None,
        gt=0,
        description="the students' context (vLLM max_model_len): each call's prompt must fit "
        "context_tokens - max_tokens[stage]; set by the serve config's `limits`",
    )
    tokenizer: str | None = Field(
        None,
        description="what counts prompt tokens: qwen2.5 or a tokenizer.json / model folder; set by `limits`",
    )
    warm_up_grammars: bool = Field(
        False,
        description="before /readyz says ready, send each server one constrained request per stage schema "
        "(xgrammar builds its tokenizer data on the first structured request: ~1.1 s with a 152k "
        "vocabulary); a failed warm-up is retried at the next readiness check",
    )
    staged_mining: bool = Field(
        False,
        description="mine the exclusion side first and the inclusion side only when it can change the "
        "decision: a patient the exclusion side already makes ineligible under every value of the "
        "unasked atoms is not asked them (marked 'not asked: the decision was already settled'). Off "
        "by default: a screen ranks near misses by |δ_E|, which then rests on the unasked atoms and "
        "can be smaller than the full chart's (the ranking says so); see data_gen/formalizer/staged.py",
    )
    reuse_values: bool = Field(
        True,
        description="values mined for a patient record are reused for other trials that declare the same "
        "atom (same definition, domain, unit), not asked again (in memory, per process; see "
        "data_gen/formalizer/value_reuse.py)",
    )
    reading: ChartReading = Field(
        default_factory=ChartReading,
        description="long charts (above read_above_tokens) are read once per patient record version "
        "into a fact sheet of verbatim excerpts that every trial's value miner reads "
        "(data_gen/formalizer/reader.py); selection: the document types and date window read",
    )
    arbiter: bool = Field(
        False,
        description="opt-in extraction-resolution arbiter (paper appendix A.5): when mined facts "
        "contradict the program's definitional constraints, the value-miner adapter re-reads the note for "
        "those atoms once; its checked overrides are applied and the pair decided again. A rejected answer "
        "or an endpoint error keeps the solver result (noted, never an error). Output limit: "
        "max_tokens.arbiter",
    )
    verbalizer: bool = Field(
        False,
        description="opt-in verbalizer (paper appendix A.6): the value-miner adapter restates the decision "
        "as prose in the response's rationale_text; it must repeat the decision and state no number the "
        "record lacks, else rationale_text is null (noted). Output limit: max_tokens.verbalizer",
    )
    timeout_s: float = Field(60.0, gt=0, description="a call slower than this answers 503 (formalizer slow)")
    concurrency: int = Field(
        16, ge=1, le=1024, description="requests in flight towards the server, all stages"
    )

    @model_validator(mode="after")
    def _one_way_to_name_servers(self):
        if self.base_url and self.base_urls:
            raise ValueError("give either base_url or base_urls, not both")
        if len({u.rstrip("/") for u in self.base_urls}) != len(self.base_urls):
            raise ValueError("base_urls lists the same server twice")
        return self

    @property
    def configured_urls(self) -> list[str]:
        """The servers this config names (empty: taken from the `vllm` section at start)."""
        return list(self.base_urls) or ([self.base_url] if self.base_url else [])

    def endpoint(self, stage_model: str, base_url: str) -> EndpointConfig:
        """The data_gen endpoint config of one adapter. No retries here: a down or slow formalizer is
        answered at once with 503 + Retry-After, and the caller decides when to try again."""
        return EndpointConfig(
            name=f"student:{stage_model}",
            base_url=base_url,
            model=stage_model,
            api_key_env=self.api_key_env,
            structured_output="vllm",
            max_tokens=self.max_tokens,
            context_tokens=self.context_tokens,
            tokenizer=self.tokenizer,
            temperature=0.0,
            timeout_s=self.timeout_s,
            concurrency=self.concurrency,
            max_retries=0,
        )


class Limits(StrictModel):
    max_body_bytes: int = Field(
        4_000_000, ge=1024, description="larger request bodies get 413 (a 128k-token chart is ~0.6 MB)"
    )
    max_batch_pairs: int = Field(1000, ge=1, description="patients x trials in one /v1/match/batch request")
    batch_concurrency: int = Field(
        8, ge=1, description="pairs of one batch or screen computed at the same time"
    )
    max_screen_pairs: int = Field(
        10_000,
        ge=1,
        description="pairs in one /v1/screen request (a patient x every registered trial, or a trial "
        "x patients); its pairs stream through the batch path, at most batch_concurrency at a time",
    )


class ReviewLimits(StrictModel):
    """Bounds on what reviews store per decision, so that no key can grow a lineage without limit."""

    max_reviews_per_lineage: int = Field(
        100,
        ge=1,
        description="superseding decisions (reviews, re-screenings) in one lineage; a review past it "
        "gets 422 and nothing is stored",
    )
    max_review_chars: int = Field(
        20_000, ge=100, description="text of one review in all (reasons, notes, evidence); more gets 413"
    )
    max_flag_note_chars: int = Field(
        2000, ge=1, le=4000, description="one flag's note for the trial's owner; longer gets 422"
    )
    history_page: int = Field(
        50,
        ge=1,
        le=500,
        description="history entries and flags per page by default (GET ...?limit= up to 500)",
    )


class SolverPoolConfig(StrictModel):
    """Solver work in worker processes (verdict.core.solver_pool): a lane for short solves, and a
    lane of its own for solves that outlive `short_budget_s`."""

    workers: int | None = Field(
        None, ge=1, description="short-lane worker processes; default: the machine's CPU count"
    )
    hard_workers: int | None = Field(
        None, ge=1, description="hard-lane worker processes (lower CPU priority); default: `workers`"
    )
    short_budget_s: float = Field(
        0.5, gt=0, description="a solve still running after this long moves to the hard lane"
    )
    time_limit_s: float | None = Field(
        None,
        gt=0,
        description="a solve running this long is ended by killing its worker (Z3 does not always "
        "honour its own limit); default: solver_timeout_ms + 3 s",
    )
    hard_nice: int = Field(10, ge=0, le=19, description="niceness added to a hard-lane worker")

    def pool(self, timeout_ms: int, alternatives: int):
        """The pool these settings describe, deciding with Engine(timeout_ms, alternatives)."""

        return SolverPool(
            timeout_ms=timeout_ms,
            alternatives=alternatives,
            workers=self.workers,
            hard_workers=self.hard_workers,
            short_budget_s=self.short_budget_s,
            time_limit_s=self.time_limit_s,
            hard_nice=self.hard_nice,
        )


class AuthLimits(StrictModel):
    """Failed API keys: after `max_failures` within `window_s` from one client address, that address
    is refused (429) for `lockout_s`, the right key included. Counted per address only, never per the
    key id a request claims (anyone who knows an id could lock its owner out)."""

    max_failures: int = Field(10, ge=1, description="wrong keys allowed per window, per client address")
    window_s: float = Field(60.0, gt=0, description="the window (seconds) failed attempts are counted in")
    lockout_s: float = Field(300.0, gt=0, description="how long an address is refused after that")


class TlsConfig(StrictModel):
    """TLS in uvicorn itself (the other way: terminate TLS at the site's reverse proxy)."""

    certfile: str | None = Field(None, description="PEM certificate (chain) file; with keyfile, serve HTTPS")
    keyfile: str | None = Field(None, description="PEM private key file of the certificate")

    @model_validator(mode="after")
    def _both_or_neither(self):
        if bool(self.certfile) != bool(self.keyfile):
            raise ValueError("give both certfile and keyfile, or neither")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.certfile)


class CdsClient(StrictModel):
    """An EHR allowed to call the CDS Hooks service: it signs each call with a JWT (CDS Hooks 2.0,
    "Trusting CDS Clients"), verified against its JSON Web Key Set."""

    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]{0,31}$",
        description="a short name: recorded as `cds:NAME` with what its calls cause (screenings, feedback)",
    )
    issuer: str = Field(min_length=1, max_length=500, description="the JWT `iss` this EHR signs with")
    jwks_url: str | None = Field(
        None, description="its JWKS (https URL; the host must pass api.egress like any FHIR host)"
    )
    jwks_file: str | None = Field(None, description="or its JWKS as a local JSON file")
    algorithms: list[Literal["ES384", "RS384", "ES256", "RS256", "ES512", "RS512"]] = Field(
        default_factory=lambda: ["ES384", "RS384"],
        min_length=1,
        description="signature algorithms accepted (CDS Hooks 2.0: ES384 and RS384)",
    )

    @model_validator(mode="after")
    def _one_key_set(self):
        if bool(self.jwks_url) == bool(self.jwks_file):
            raise ValueError("give exactly one of jwks_url and jwks_file")
        if self.jwks_url:
            problem = base_url_problem(self.jwks_url)
            if problem:
                raise ValueError(f"jwks_url {problem}")
        return self


class CdsHooksConfig(StrictModel):
    """The CDS Hooks 2.0 service (`/cds-services`, serve/cds_hooks): trial matches as cards in the
    EHR's patient view. Off while `clients` is empty (its routes answer 404)."""

    clients: list[CdsClient] = Field(
        default_factory=list,
        description="the EHRs allowed to call it; needs api.public_url (the JWT audience)",
    )
    service_id: str = Field(
        "verdict-trial-matches", pattern=r"^[a-z0-9][a-z0-9-]{0,63}$", description="its id in discovery"
    )
    title: str = Field("Clinical trial matches", min_length=1, max_length=100)
    answer_within_s: float = Field(
        0.5,
        gt=0,
        le=10,
        description="latency bound of a hook call: the cards are read from decisions already made; a read "
        "slower than this answers no cards (the chart is never held up)",
    )
    queue_size: int = Field(
        100,
        ge=1,
        le=100_000,
        description="patients waiting for a screening (queued when a hook call finds a registered trial "
        "without a current decision); past it nothing more is queued until one is done",
    )
    requeue_after_s: float = Field(
        3600.0,
        gt=0,
        description="a patient is queued again for a trial version no sooner than this after it was queued "
        "for it (a call during its screening queues nothing twice)",
    )
    max_cards: int = Field(10, ge=1, le=100, description="cards per answer, best first")
    jwt_leeway_s: float = Field(
        10.0, ge=0, le=300, description="clock skew allowed on a JWT's exp, iat and nbf"
    )
    jwks_refresh_s: float = Field(
        300.0, gt=0, description="how long a fetched JWKS is kept (an unknown key id fetches it again)"
    )
    jwks_timeout_s: float = Field(5.0, gt=0, le=60, description="one JWKS fetch's time limit")
    max_remembered_jti: int = Field(
        100_000,
        ge=100,
        description="JWT ids remembered until their token expires (a replayed jti is refused); when that "
        "many unexpired tokens are remembered, a new one is answered 503 until one expires",
    )

    @field_validator("clients")
    @classmethod
    def _unique(cls, v: list[CdsClient]) -> list[CdsClient]:
        for attr in ("name", "issuer"):
            values = [getattr(c, attr) for c in v]
            if len(set(values)) != len(values):
                raise ValueError(f"two clients have the same {attr}")
        return v


class ApiConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535, description="0 = a free port")
    formalizer: FormalizerConfig = Field(default_factory=FormalizerConfig)
    egress: EgressConfig = Field(default_factory=EgressConfig, description="where patient text may go")
    audit_db: str = Field(
        "runs/serve/audit.sqlite",
        description="append-only audit store: a SQLite file (one node), or a postgresql://USER@HOST:PORT/DB "
        "URL (several replicas; no password in the URL: see audit_password_env)",
    )
    audit_password_env: str | None = Field(
        None, description="environment variable with the PostgreSQL audit store's password (or PGPASSWORD)"
    )
    store_notes: bool = Field(
        True,
        description="keep notes in the audit store (for evidence in context); false keeps only their hash",
    )
    api_keys: str = Field("runs/serve/api_keys.json", description="hashed API keys (verdict serve keys add)")
    audit_hash_key: str | None = Field(
        None,
        description="under store_notes false: the store's secret for keyed hashes of the note text it does "
        "not keep (HMAC-SHA256), created 0600 on first use; default: audit_hash.key beside api_keys. "
        "Replicas of one PostgreSQL store share one file",
    )
    default_policy: str = "prescreen"
    solver_timeout_ms: int = Field(
        5000,
        ge=1,
        description="solver time per request, all its solver calls together: a decision over it is "
        "`undetermined`, an uploaded program's satisfiability check over it answers 422",
    )
    alternatives: int = Field(2, ge=0, description="extra minimum pivotal sets to enumerate")
    solver_pool: SolverPoolConfig = Field(
        default_factory=SolverPoolConfig, description="the worker processes every decision and check runs in"
    )
    retry_after_s: int = Field(30, ge=1, description="Retry-After sent with 503 when the formalizer is down")
    limits: Limits = Field(default_factory=Limits)
    reviews: ReviewLimits = Field(
        default_factory=ReviewLimits, description="per-lineage bounds of the review loop, page sizes"
    )
    log_file: str | None = Field(None, description="service log; default: stderr")
    auth: AuthLimits = Field(default_factory=AuthLimits, description="rate limit and lockout on failed keys")
    tls: TlsConfig = Field(default_factory=TlsConfig, description="HTTPS in the service itself")
    sessions: SessionConfig = Field(
        default_factory=SessionConfig, description="browser login sessions of the clinician page (/login)"
    )
    docs: bool = Field(
        False, description="serve /openapi.json (any valid key needed; no Swagger UI or ReDoc pages)"
    )
    public_url: str | None = Field(
        None,
        description="the service's base URL as its clients reach it, e.g. https://verdict.site.example: "
        "the absolute links of a screening's ResearchSubjects. Unset: those links are relative "
        "(/v1/decisions/...); never taken from a request's Host header, which the client sets",
    )

    cds_hooks: CdsHooksConfig = Field(
        default_factory=CdsHooksConfig, description="the CDS Hooks service: trial matches in the EHR"
    )

    @model_validator(mode="after")
    def _cds_audience(self):
        if self.cds_hooks.clients and not self.public_url:
            raise ValueError(
                "cds_hooks.clients needs public_url: it is the audience of the EHR's JWTs and the base of "
                "the cards' links"
            )
        return self

    @field_validator("public_url")
    @classmethod
    def _a_base_url(cls, v: str | None) -> str | None:
        return checked_base_url(v, "the public URL")

    @property
    def audit_hash_key_path(self) -> str:

        return self.audit_hash_key or str(Path(self.api_keys).with_name("audit_hash.key"))

    @field_validator("audit_db")
    @classmethod
    def _no_password_in_url(cls, v: str) -> str:

        if v.startswith(("postgresql://", "postgres://")) and urlsplit(v).password:
            raise ValueError(
                "the URL carries a password: remove it and name a variable in audit_password_env"
            )
        return v

    @field_validator("default_policy")
    @classmethod
    def _policy_name(cls, v: str) -> str:
        if not re.fullmatch(POLICY_NAME, v):
            raise ValueError(f"'{v}' is not a policy name (configs/policies/NAME.yaml)")
        return v
