"""What every backend is: a config class and a worker that decides one labelled pair.

A backend is declared in a bench config by ``kind`` (lm-eval-harness style registry):

    backends:
      - {name: recorded-v6, kind: recorded, path: ../shared/data/reference/v6}
      - {name: gpt-5-mini, kind: formalizer, parser: gpt-5-mini, miner: gpt-5-mini}

`register_backend("kind")` adds a class; `backend_config(dict)` validates one entry against the
class's own strict config model, so a misspelled key is an error naming the backend and the key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import Field, ValidationError
from verdict.core.configs import StrictModel, describe

from ..datasets import BenchDataset
from ..protocol import BenchError, Flip, LabeledPair, PairResult, Placement


class BackendConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.@+\-]{0,63}$", description="label in reports")
    kind: str
    description: str = ""
    policy: str | None = Field(None, description="missingness policy for this backend (default: the run's)")


@dataclass
class RunContext:
    """What the run hands every backend."""

    dataset: BenchDataset
    engine: object  # verdict_core.engine.Engine
    policy: object  # verdict_core.policy.Policy, the run's default
    run_name: str
    run_dir: Path
    cache_path: Path
    egress: object  # data_gen.formalizer.egress.EgressPolicy
    ledger: object | None = None  # data_gen.formalizer.ledger.Ledger over the main cache
    vllm_url: str | None = None
    _caches: dict = field(default_factory=dict)

    def cache(self, repeat: int):
        """The call cache of a repeat: repeat 0 shares the teacher cache (answers already paid for
        are reused); repeat r > 0 has its own file in the run directory, so a repeat really asks
        the endpoint again, and a resumed repeat still never pays twice."""
        from verdict.data_gen.formalizer import CallCache

        if repeat not in self._caches:
            path = self.cache_path if repeat == 0 else self.run_dir / f"cache-repeat-{repeat}.sqlite"
            self._caches[repeat] = CallCache(path)
            if repeat and self.ledger is not None:  # the budget counts what earlier sessions paid here too
                self.ledger.spent_at_start += self._caches[repeat].spent(self.ledger.run)
        return self._caches[repeat]

    def close(self) -> None:
        for c in self._caches.values():
            c.close()
        self._caches.clear()


class Backend:
    kind: ClassVar[str]
    config_class: ClassVar[type[BackendConfig]]
    formal: ClassVar[bool] = False  # decisions come from the core (PivotalFlipRate applies)

    def __init__(self, config: BackendConfig, ctx: RunContext):
        self.config = config
        self.ctx = ctx
        self._policy = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def policy(self):
        if self._policy is None:
            from verdict.core.policy import load_policy

            self._policy = load_policy(self.config.policy) if self.config.policy else self.ctx.policy
        return self._policy

    def problems(self) -> list[str]:
        """Input problems found while loading the backend (reported with the dataset's)."""
        return []

    def preflight(self) -> None:
        """Refuse before anything is sent (e.g. patient text towards a host not allowed)."""

    def unavailable(self, pair: LabeledPair) -> str | None:
        """Why this backend cannot decide the pair at all (it is then left out of its scores)."""
        return None

    def missing_texts(self, pair: LabeledPair) -> str | None:
        """For backends that read the texts: the criteria or the note the dataset lacks."""
        ds = self.ctx.dataset
        if pair.trial_id not in ds.trials:
            return "no criteria text for the trial"
        if pair.patient_id not in ds.patients:
            return "no note for the patient"
        return None

    async def decide(self, pair: LabeledPair, repeat: int) -> PairResult:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass

    # -- helpers ----------------------------------------------------------------------------------
    def result(self, pair: LabeledPair, repeat: int, **kw) -> PairResult:
        return PairResult(
            backend=self.name,
            repeat=repeat,
            pair_id=pair.pair_id,
            patient_id=pair.patient_id,
            trial_id=pair.trial_id,
            label=pair.label,
            grade=pair.grade,
            ranking_only=pair.ranking_only,
            **kw,
        )

    def failed(self, pair: LabeledPair, repeat: int, reason: str, **kw) -> PairResult:
        """The pair's result when a stage failed: no decision, the reason why."""
        return self.result(pair, repeat, status="failed", reason=reason, **kw)


BACKENDS: dict[str, type[Backend]] = {}


def register_backend(kind: str):
    def deco(cls: type[Backend]) -> type[Backend]:
        cls.kind = kind
        BACKENDS[kind] = cls
        return cls

    return deco


def backend_config(data) -> BackendConfig:
    if isinstance(data, BackendConfig):
        return data
    if not isinstance(data, dict):
        raise ValueError("each backend is a mapping with at least 'name' and 'kind'")
    kind = data.get("kind")
    cls = BACKENDS.get(kind)
    label = data.get("name") or "?"
    if cls is None:
        raise ValueError(f"backend '{label}': unknown kind '{kind}' (known: {', '.join(sorted(BACKENDS))})")
    try:
        return cls.config_class.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"backend '{label}' ({kind}): " + "; ".join(describe(e, cls.config_class))) from None


def decide_formal(engine, program, patient, case: str) -> tuple[object, list[Flip], float]:
    """Decide, then decide the formal counterfactual of the primary pivotal conditions (paper
    Def. 2-3): the decision, its flip outcome (if it has δ) and the solve time in ms."""
    from verdict.core.counterfactual import apply_pivotal

    t0 = time.perf_counter()
    d = engine.decide(program, patient)
    solve_ms = (time.perf_counter() - t0) * 1000
    flips = []
    if d.decision != "undetermined" and d.pivotal is not None and d.pivotal.conditions:
        d2 = engine.decide(program, apply_pivotal(patient, d.pivotal.conditions))
        flips.append(
            Flip(
                case=case,
                direction=d.pivotal.direction,
                flipped=d2.decision not in (d.decision, "undetermined"),
            )
        )
    return d, flips, solve_ms


def placement_of(d) -> Placement:
    """Where `verdict screen` puts the decision (`verdict.core.ranking.placement`, one implementation)."""
    from verdict.core.ranking import placement

    tier, distance, _, _, complete = placement(d)
    return Placement(tier=tier, distance=distance, complete=complete)


def make_backend(config: BackendConfig, ctx: RunContext) -> Backend:
    cls = BACKENDS.get(config.kind)
    if cls is None:
        raise BenchError(f"unknown backend kind '{config.kind}'")
    return cls(config, ctx)
