"""A benchmark run's config (`configs/bench/NAME.yaml`): the dataset, the backends, the policy,
repeats and scoring. Strict: an unknown key is an error naming it. The run directory keeps a copy,
so `verdict bench run --config RUN_DIR/config.yaml` reproduces the run from its config alone.

    name: trec2021-gpt-5-mini
    dataset: {kind: trec2021, pairs: ..., patients: ..., trials: [...], data_class: public,
              sample: {per_class: 50, seed: 0}}
    backends:
      - {name: verdict-gpt-5-mini, kind: formalizer, parser: gpt-5-mini, miner: gpt-5-mini}
      - {name: llmmatch-gpt-5-mini, kind: llm_match, endpoint: gpt-5-mini}
    policy: prescreen

A `formalizer` backend may turn on the service's opt-in stages (`arbiter: true`, `verbalizer: true`;
both off by default; bench/backends/formalizer.py documents them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator
from verdict.core.configs import StrictModel
from verdict.core.program import Id
from verdict.data_gen.formalizer import EgressConfig
from verdict.serve.vllm.config import VLLMConfig

from .backends import BackendConfig, backend_config
from .chart_reading import ChartReadingConfig
from .counterfactual import CounterfactualConfig
from .datasets import DatasetConfig
from .protocol import BenchError
from .ranking import RankingConfig


class ScoringConfig(StrictModel):
    bootstrap_b: int = Field(2000, ge=100, description="bootstrap resamples for the 95% CIs")
    seed: int = Field(0, description="seed of the bootstrap")
    failed_as: Literal["ineligible", "excluded"] = Field(
        "ineligible",
        description="a pair a backend could not decide (output invalid after the repair, solver limit) "
        "counts as not eligible, or is left out of that backend's scores (coverage is reported either way)",
    )


class ReferencePoint(StrictModel):
    """A published figure shown next to the measured ones (e.g. the paper's Table 1 row)."""

    label: str
    f1: float | None = None
    accuracy: float | None = None
    n: int | None = None
    source: str = ""


class BenchConfig(StrictModel):
    name: Id
    description: str = ""
    purpose: Literal["result", "machinery_check"] = Field(
        "result",
        description="machinery_check: a run against a scripted server; the report labels its figures "
        "as such and sets no published figure beside them",
    )
    out_dir: str = Field("runs/bench", description="the run is written to OUT_DIR/NAME/")
    cache: str = Field(
        "runs/teacher-cache.sqlite",
        description="call cache shared with teacher runs: answers "
        "already paid for are reused, none is paid twice",
    )
    dataset: DatasetConfig
    backends: list[SerializeAsAny[BackendConfig]] = Field(min_length=1)
    policy: str = Field(
        "prescreen", description="missingness policy (configs/policies) for the formal backends"
    )
    repeats: int = Field(
        1, ge=1, le=20, description="runs of every backend over the pairs (policy consistency)"
    )
    concurrency: int = Field(8, ge=1, le=256, description="pairs in flight per backend")
    solver_timeout_ms: int = Field(5000, ge=100)
    budget_usd: float | None = Field(None, ge=0, description="stop before the run's paid calls exceed this")
    egress: EgressConfig = Field(default_factory=EgressConfig)
    vllm: VLLMConfig | None = Field(
        None,
        description="start this vLLM server for the run (backends with "
        "local_vllm: true send their calls to it)",
    )
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    ranking: RankingConfig = Field(default_factory=RankingConfig)
    counterfactual: CounterfactualConfig = Field(default_factory=CounterfactualConfig)
    chart_reading: ChartReadingConfig = Field(default_factory=ChartReadingConfig)
    reference_points: list[ReferencePoint] = Field(default_factory=list)

    @field_validator("backends", mode="before")
    @classmethod
    def _typed_backends(cls, v):
        if not isinstance(v, list):
            raise ValueError("backends is a list of backend mappings")
        return [backend_config(b) for b in v]

    @model_validator(mode="after")
    def _consistent(self):
        names = [b.name for b in self.backends]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"backend names must be unique (repeated: {', '.join(dup)})")
        local = [b.name for b in self.backends if getattr(b, "local_vllm", False)]
        if local and self.vllm is None:
            raise ValueError(
                f"backends {', '.join(local)} use local_vllm: add a 'vllm' block (the server to start)"
            )
        return self

    # -- what the results depend on (a resumed run must not mix configs) ---------------------------
    def work_identity(self) -> dict:
        out = {
            "dataset": self.dataset.model_dump(mode="json"),
            "backends": [b.model_dump(mode="json") for b in self.backends],
            "policy": self.policy,
            "solver_timeout_ms": self.solver_timeout_ms,
            "vllm": None
            if self.vllm is None
            else {
                "model": self.vllm.model,
                "adapters": self.vllm.adapters,
                "served_model_name": self.vllm.served_model_name,
            },
        }
        if self.chart_reading.enabled:  # its records depend on the charts, rows and reading settings
            out["chart_reading"] = self.chart_reading.model_dump(mode="json", exclude={"max_listed"})
        return out

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


def load_bench_config(name_or_path: str | Path, overrides: list[str] | None = None) -> BenchConfig:
    """A config by name (configs/bench/NAME.yaml) or path; ``overrides`` as ``--set key=value``."""
    from verdict.core.configs import load_config

    return load_config("bench", BenchConfig, name_or_path, overrides, BenchError, "bench")[1]
