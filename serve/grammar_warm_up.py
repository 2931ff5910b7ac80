"""Grammar warm-up: every up server not yet warm gets one constrained request per stage schema (no
patient text, 1 new token), so that the first real request does not pay the structured-output
backend's one-time setup. Readiness waits for one warm server (serve/health/serving.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from verdict.data_gen.formalizer import (
    EndpointError,
    Formalizer,
    PoolMember,
    build_request,
    core_schema,
    failure_reason,
    with_atom_enum,
)

from .egress_check import origin_of
from .formalizers import Formalizers

log = logging.getLogger("verdict.serve")


class GrammarWarmUp:
    def __init__(self, formalizers: Formalizers, enabled: bool):
        self.formalizers = formalizers
        self.enabled = enabled
        self.problem: str | None = None  # why the last attempt left a server cold
        self._warm: set[str] = set()  # base URLs of the servers whose grammars are warm
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """At the service's start: check the servers and warm them in the background."""
        if not self.enabled:
            return
        try:
            self._task = asyncio.get_running_loop().create_task(self._at_start())
        except RuntimeError:  # no loop yet: the first readiness check warms up
            pass

    async def _at_start(self) -> None:
        await self.formalizers.pool.check_all()
        await self.warm()

    def is_warm(self, member: PoolMember) -> bool:
        return member.base_url in self._warm

    @property
    def busy(self) -> bool:
        """A warm-up is under way (a readiness check does not wait for it)."""
        return self._lock.locked()

    def requests(self) -> list[tuple[Formalizer, str, dict, str]]:
        """One request per stage schema: the per-criterion parser's and the value miner's."""
        f = self.formalizers
        return [
            (f.parser, "parser", core_schema("parsed-criterion"), "parsed_criterion"),
            (
                f.miner,
                "miner_inclusion",
                with_atom_enum(core_schema("value-miner"), ["warm_up"]),
                "value_miner",
            ),
        ]

    async def warm(self) -> str | None:
        """Warm every up server not yet warm. Returns None when every up server is warm, else why not
        (retried on the next call)."""
        async with self._lock:
            problems = []
            for m in self.formalizers.pool.members:
                if m.state != "up" or m.base_url in self._warm:
                    continue
                try:
                    await self._warm_member(m)
                except EndpointError as e:
                    problems.append(f"{origin_of(m.base_url)}: {failure_reason(e)}")
                    log.warning(
                        "grammar warm-up of %s failed (%s); retried at the next readiness check",
                        m.base_url,
                        failure_reason(e),
                    )
                    continue
                self._warm.add(m.base_url)
            self.problem = "; ".join(problems) or None
            return self.problem

    async def _warm_member(self, m: PoolMember) -> None:
        for fz, stage, schema, name in self.requests():
            msgs = [{"role": "system", "content": "Return JSON."}, {"role": "user", "content": "{}"}]
            req = build_request(fz.endpoint, stage, msgs, schema, name)
            req[fz.endpoint.max_tokens_param] = 1
            await m.client.complete(
                req, carries_patient_text=False, data_class="public", what=f"{stage} grammar warm-up"
            )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # cancelled: how it ends no longer matters
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
