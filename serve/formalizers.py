"""The two student formalizers (the parser, the value miner) and the endpoint pool they share.

Formalizer calls go through `verdict.data_gen.formalizer.Formalizer` (the one implementation of
prompt -> structured output -> validation -> one repair), pointed at the student adapters. Built
only once the egress check passed (serve/egress_check.py).
"""

from __future__ import annotations

from verdict.core.solver_pool import SolverPool
from verdict.data_gen.formalizer import EgressPolicy, EndpointPool, Formalizer, PoolMember, ValueReuse

from .api_config import ApiConfig
from .egress_check import check_formalizer_hosts, origin_of
from .model_files import ModelFiles


class Formalizers:
    def __init__(self, config: ApiConfig, base_url: str | list[str], engine: SolverPool):
        fc = config.formalizer
        self.base_urls = [u.rstrip("/") for u in ([base_url] if isinstance(base_url, str) else base_url)]
        self.base_url = self.base_urls[0]  # names the endpoint in cache keys: the first of the pool
        self.egress = EgressPolicy.from_config(config.egress)
        check_formalizer_hosts(self.egress, self.base_urls)
        self.model_files = ModelFiles(fc.model_files)  # hashed in the background
        parser_ep = fc.endpoint(fc.parser_model, self.base_url)
        miner_ep = fc.endpoint(fc.value_miner_model, self.base_url)
        # One pool for both adapters: per server, one bound on requests in flight towards it.
        self.pool = EndpointPool(
            parser_ep,
            self.base_urls,
            required_models=[fc.parser_model, fc.value_miner_model],
            egress=self.egress,
            check_interval_s=fc.health_check_interval_s,
            check_timeout_s=fc.health_check_timeout_s,
        )
        self.parser = Formalizer(
            parser_ep, engine=engine, egress=self.egress, prompts=fc.prompts, run="serve", client=self.pool
        )
        self.miner = Formalizer(
            miner_ep,
            engine=engine,
            egress=self.egress,
            prompts=fc.prompts,
            run="serve",
            client=self.pool,
            value_reuse=ValueReuse() if fc.reuse_values else None,
            reading=fc.reading,
        )
        self._base_model: str | None = None

    @property
    def wanted(self) -> list[str]:
        """The served names of both adapters."""
        return [self.parser.endpoint.model, self.miner.endpoint.model]

    @property
    def label(self) -> str:
        """The pool's servers as answers name them (scheme://host:port, comma-separated)."""
        return ", ".join(origin_of(u) for u in self.base_urls)

    def note_base_model(self, member: PoolMember) -> None:
        """Learn the adapters' base model from a server found up (readiness checks every server)."""
        if member.state == "up" and self._base_model is None:
            wanted = self.wanted
            self._base_model = member.parents.get(wanted[0]) or member.parents.get(wanted[1])

    async def base_model(self) -> str | None:
        """The adapters' base model as a server lists it. Asks only servers not marked down and never
        checked: a down one is re-checked by the pool's own schedule, never brought back by a match,
        and a checked one that lists no parent (no adapters) is not asked again at every match."""
        for m in self.pool.members:
            if self._base_model is not None:
                break
            if m.usable and not m.parents and m.checked_at is None:
                await self.pool.check(m)
            self._base_model = next((m.parents[w] for w in self.wanted if w in m.parents), None)
        return self._base_model
