"""The matching service's parts, built once per process from the config: what `create_app`, the
batch screening job and the tests start, and what the routers reach through serve/dependencies.py.

    services = Services(api_config, "http://127.0.0.1:8011/v1")
    await services.matching.match(req, caller)      # serve/matching/serving.py
    await services.trials.register_trial(req, caller)  # serve/trials/serving.py
    await services.health.readiness()               # serve/health/serving.py

Shared by every group: the solver pool, the audit store, the metrics, the students behind their
endpoint pool (serve/formalizers.py, after the egress check), the stage runner, the program cache
and the grammar warm-up.
"""

from __future__ import annotations

import asyncio

from verdict.core.solver_pool import SolverPool
from verdict.data_gen.formalizer import core_schema

from .api_config import ApiConfig
from .audit import AuditStore, open_store
from .formalizers import Formalizers
from .grammar_warm_up import GrammarWarmUp
from .health.serving import HealthService
from .matching.serving import MatchingService
from .metrics import ServiceMetrics
from .program_cache import ProgramCache
from .quote_hash import QuoteHasher
from .stage_runner import StageRunner
from .trials.serving import TrialService


class Services:
    def __init__(
        self,
        config: ApiConfig,
        base_url: str | list[str],
        *,
        audit: AuditStore | None = None,
        metrics: ServiceMetrics | None = None,
    ):
        self.config = config
        # Every decision and satisfiability check, the parser's and the arbiter's too, runs in the
        # pool's worker processes (verdict.core.solver_pool) under solver_timeout_ms: a hard program
        # never makes a short decision wait, and no solver work runs on the event loop.
        self.engine: SolverPool = config.solver_pool.pool(config.solver_timeout_ms, config.alternatives)
        self.formalizers = Formalizers(config, base_url, self.engine)  # refuses a host not allowed
        # Under store_notes false: the store's secret for hashing the text it does not keep.
        self.quote_hasher = None if config.store_notes else QuoteHasher.from_file(config.audit_hash_key_path)
        self.audit = audit or open_store(config)
        self.metrics = metrics or ServiceMetrics()
        self.metrics.watch_solver_pool(self.engine)
        self.stages = StageRunner(self.metrics, config.formalizer.timeout_s, config.retry_after_s)
        self.programs = ProgramCache()
        self.grammars = GrammarWarmUp(self.formalizers, config.formalizer.warm_up_grammars)
        self.trials = TrialService(
            self.audit, self.engine, self.formalizers.parser, self.stages, self.metrics, self.programs
        )
        self.matching = MatchingService(
            config,
            self.audit,
            self.engine,
            self.metrics,
            self.formalizers,
            self.stages,
            self.trials,
            self.quote_hasher,
        )
        self.health = HealthService(self.formalizers, self.grammars)

    def warm_up(self) -> None:
        """Pay the first request's one-time costs at start (client library import, output schemas,
        the solver pool's fork server), and warm the grammars in the background."""
        import openai  # noqa: F401  - heavy optional dependency (serve extra): imported at start, not at import

        self.engine.start()
        core_schema("parsed-criterion")
        core_schema("value-miner")
        self.grammars.start()

    async def aclose(self) -> None:
        await self.grammars.aclose()
        await self.formalizers.pool.aclose()
        await asyncio.to_thread(self.engine.close)
