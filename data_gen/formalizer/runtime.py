"""The formalizer runtime: one endpoint (a teacher or a student), the shared stage loop (call ->
validate -> one repair), the request cache with single flight, the ledger and the egress check.

The stages are modules of their own beside it (`parser.py`, `miner.py`, `reader.py`, `arbiter.py`,
`verbalizer.py`), each a function of a `Runtime`; `stages.py` gathers them as the methods of
`Formalizer`, the package's entry. This module imports no stage: stages depend on the runtime,
never the other way round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from verdict.core.engine import Engine

from .budget import TokenCounter, counter_for
from .cache import CachedCall, CallCache, CallMeta, canonical_key
from .checks import Check
from .client import EndpointClient, build_request
from .egress import EgressPolicy
from .endpoint_config import EndpointConfig
from .ledger import Ledger, worst_case_cost
from .prompt_templates import PromptTemplate, load_prompt, stage_prompt
from .protocol import Attempt, StageResult, Usage

if TYPE_CHECKING:  # type-only: the stages' state (those modules import no runtime at run time)
    from .reader import ChartReading, FactSheets
    from .value_reuse import ValueReuse

log = logging.getLogger("verdict.data_gen.formalizer")


class Runtime:
    """One endpoint (a teacher or a student) and the loop every stage calls it through
    (`run_stage`); the stages' own state (value reuse, chart reading) is set by `Formalizer`."""

    def __init__(
        self,
        endpoint: EndpointConfig,
        *,
        engine: Engine | None = None,
        cache: CallCache | None = None,
        ledger: Ledger | None = None,
        egress: EgressPolicy | None = None,
        prompts: dict[str, str] | None = None,
        run: str = "adhoc",
        client: EndpointClient | None = None,
    ):
        self.endpoint = endpoint
        # Mined values of a patient record reused across trials (value_reuse.py); None: mine every time.
        self.value_reuse: ValueReuse | None = None
        # Long charts read once per patient record version, the fact sheets shared by every trial
        # (reader.py); None: every chart is mined whole.
        self.reading: ChartReading | None = None
        self.fact_sheets: FactSheets | None = None
        # The engine that checks outputs (satisfiability, the arbiter's overrides): the caller's, so
        # checks run under its solver limit and a program compiled for a check serves its decisions
        # too. Without one, the formalizer has an engine of its own (the core's default limits).
        self.engine = engine if engine is not None else Engine()
        self.cache = cache
        self.ledger = ledger
        self.client = client or EndpointClient(endpoint, egress=egress)
        self.prompts = dict(prompts or {})
        self.run = run
        self.repair_prompt = load_prompt("repair", "v1")
        # Single flight: identical requests in flight at once (e.g. the same exclusion atoms for
        # one patient across trials) share one call instead of both missing the cache.
        self._pending: dict[str, _Flight] = {}
        self._tokens: TokenCounter | None = None
        self._slots: dict[str, asyncio.Semaphore] = {}

    @property
    def tokens(self) -> TokenCounter:
        """Counts prompt tokens the way this endpoint's model does (or an upper estimate)."""
        if self._tokens is None:
            self._tokens = counter_for(self.endpoint.tokenizer)
        return self._tokens

    def prompt_budget(self, stage: str) -> int | None:
        """The most prompt tokens a call of this stage may carry; None: no limit configured."""
        t = self.endpoint
        if t.context_tokens is None:
            return None
        return t.context_tokens - t.max_tokens.for_stage(stage)

    def planner_limits(self, stage: str) -> dict:
        """What a call planner (`plan_miner_calls`, `plan_reader_calls`) takes of this endpoint for
        `stage`, as its keyword arguments: the tokenizer's counts, both budgets, the prompt version."""
        return {
            "count_messages": self.tokens.count_messages,
            "count_text": self.tokens.count_text,
            "prompt_budget": self.prompt_budget(stage),
            "completion_budget": self.endpoint.max_tokens.for_stage(stage),
            "prompt_version": self.prompts.get(stage),
        }

    async def aclose(self) -> None:
        await self.client.aclose()

    def prompt(self, stage: str) -> PromptTemplate:
        return stage_prompt(stage, self.prompts.get(stage))

    def request_key(
        self, stage: str, messages: list[dict[str, str]], schema: dict | None, schema_name: str
    ) -> tuple[str, dict]:
        """(cache key, request): the key covers the endpoint, the templates behind the messages and
        every request field, so a change to any of them is a new call."""
        request = build_request(self.endpoint, stage, messages, schema, schema_name)
        tmpl = self.prompt(stage)
        ident = {
            "endpoint": self.endpoint.endpoint_id,
            "prompt": f"{tmpl.ident}#{tmpl.sha256}",
            "repair": f"{self.repair_prompt.ident}#{self.repair_prompt.sha256}",
            "request": request,
        }
        return canonical_key(ident), request

    def stage_slots(self, stage: str) -> asyncio.Semaphore:
        """At most `concurrency` calls of this stage wait at once on this endpoint (each holds a
        budget reservation while it waits), one semaphore per stage."""
        if stage not in self._slots:
            self._slots[stage] = asyncio.Semaphore(max(1, self.endpoint.concurrency))
        return self._slots[stage]

    # -- the shared stage loop: the public stage interface ------------------------------------------
    async def run_stage(
        self,
        stage: str,
        messages: list[dict[str, str]],
        schema: dict,
        schema_name: str,
        validate: Callable[[CachedCall], Check],
        *,
        patient_text: bool,
        data_class: str,
        ids: str,
        sensitive: tuple[str, ...] = (),
        solver: bool = False,
        no_repair: Collection[str] = (),
    ) -> StageResult:
        """Run one formalizer stage: the one interface every stage (parser, miner, reader, arbiter,
        verbalizer, a bench backend's own stage) calls the endpoint through.

        `messages` are sent (from the cache when this exact request was answered before; identical
        requests in flight share one call); `validate` checks the answer and returns a `Check`; on
        problems the answer is repaired once with them fed back. `stage` names the prompt and the
        completion budget (`max_tokens.for_stage`); `schema`/`schema_name` the structured output;
        `patient_text`/`data_class` what the egress policy checks; `ids` names the item in the log
        (never text); `sensitive` are texts the client keeps out of errors; `solver`: the check runs
        the solver (run in a thread); `no_repair`: rejection reasons the caller handles itself (no
        repair is asked for them: the sparse miner splits a cut-off chunk instead). Returns the
        StageResult: accepted (with the checked output) or rejected (with the problems), its
        attempts and usage."""
        usage = Usage()
        attempts: list[Attempt] = []
        convo = list(messages)
        check = None
        for _attempt in range(2):  # the output, then one repair with the problems fed back
            call, cached = await self._call(
                stage, convo, schema, schema_name, patient_text, data_class, sensitive
            )
            usage = usage.add(_call_usage(call, cached))
            # Checks that run the solver go to a thread: the event loop keeps the other calls moving.
            check = await asyncio.to_thread(validate, call) if solver else validate(call)
            attempts.append(
                Attempt(
                    key=call.key,
                    cached=cached,
                    finish_reason=call.finish_reason,
                    problems=check.messages,
                    reason=check.reason,
                )
            )
            if check.ok or check.reason in no_repair:
                break
            convo = convo + self._repair_turns(call, check)
        assert check is not None
        _log_outcome(stage, ids, check, attempts, usage)
        return check.result(
            stage=stage,
            teacher=self.endpoint.name,
            model=self.endpoint.model,
            prompt_version=self.prompt(stage).ident,
            messages=messages,
            attempts=attempts,
            usage=usage,
        )

    def _repair_turns(self, call: CachedCall, check: Check) -> list[dict[str, str]]:
        """The turns that ask for one repair: the rejected answer, then the problems fed back (the
        first 20) in the repair prompt's user turn."""
        problems = "\n".join(f"- {p}" for p in check.messages[:20])
        return [
            {"role": "assistant", "content": call.content or ""},
            *[m for m in self.repair_prompt.render(PROBLEMS=problems) if m["role"] == "user"],
        ]

    async def _call(
        self,
        stage: str,
        messages: list[dict[str, str]],
        schema: dict,
        schema_name: str,
        patient_text: bool,
        data_class: str,
        sensitive: tuple[str, ...],
    ) -> tuple[CachedCall, bool]:
        """One answered call: from the cache if this exact request was ever paid for, else sent.

        Identical calls in flight share one upstream call. It runs as its own task and each caller
        awaits a shield of it, so a caller that is cancelled (its client went away, its other pass
        failed) leaves the others their answer; the call is cancelled only when nobody waits."""
        key, request = self.request_key(stage, messages, schema, schema_name)
        flight = self._pending.get(key)
        if flight is None:
            task = asyncio.ensure_future(
                self._call_once(key, request, stage, messages, patient_text, data_class, sensitive)
            )
            flight = self._pending[key] = _Flight(task)
            task.add_done_callback(lambda _t, k=key, f=flight: self._forget(k, f))
        flight.waiters += 1
        try:
            call, cached = await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                self._forget(key, flight)  # a new caller starts afresh instead of joining a cancelled call
                flight.task.cancel()
        if flight.claimed:  # the call was answered once already: the others count it as a hit
            if self.cache is not None:
                await asyncio.to_thread(self.cache.record_hit, call, self._meta(stage))
            return call, True
        flight.claimed = True
        return call, cached

    def _forget(self, key: str, flight: _Flight) -> None:
        if self._pending.get(key) is flight:
            del self._pending[key]

    def _meta(self, stage: str) -> CallMeta:
        t = self.endpoint
        return CallMeta(
            run=self.run,
            stage=stage,
            teacher=t.name,
            endpoint=t.endpoint_id,
            model=t.model,
            prompt=self.prompt(stage).ident,
        )

    async def _call_once(
        self,
        key: str,
        request: dict,
        stage: str,
        messages: list[dict[str, str]],
        patient_text: bool,
        data_class: str,
        sensitive: tuple[str, ...],
    ) -> tuple[CachedCall, bool]:
        t = self.endpoint
        meta = self._meta(stage)
        if self.cache is not None:
            hit = self.cache.get(key)  # a read: never waits for a write in progress
            if hit is not None:
                await asyncio.to_thread(self.cache.record_hit, hit, meta)
                return hit, True
        what = f"stage '{stage}' of teacher '{t.name}'"
        # Egress first, so a refused request is refused whatever the budget says.
        self.client.check_egress(carries_patient_text=patient_text, data_class=data_class, what=what)
        ticket = (
            self.ledger.reserve(worst_case_cost(t, messages, t.max_tokens.for_stage(stage)))
            if self.ledger
            else None
        )
        if self.cache is not None:
            # Writes run in threads: the event loop never waits for the database lock or a sync.
            await asyncio.to_thread(self.cache.begin, key, meta)
        try:
            comp = await self.client.complete(
                request,
                carries_patient_text=patient_text,
                data_class=data_class,
                what=what,
                sensitive=sensitive,
                request_id=key,
            )
        except asyncio.CancelledError:
            if self.ledger is not None and ticket is not None:
                self.ledger.settle(ticket, None)
            raise  # the journal entry stays: the request may have reached the server
        except BaseException:
            if self.ledger is not None and ticket is not None:
                self.ledger.settle(ticket, None)
            if self.cache is not None:
                await asyncio.to_thread(self.cache.abandon, key, meta)
            raise
        cost = t.prices.cost(comp.prompt_tokens, comp.completion_tokens)
        call = CachedCall(
            key=key,
            content=comp.content,
            finish_reason=comp.finish_reason,
            prompt_tokens=comp.prompt_tokens,
            completion_tokens=comp.completion_tokens,
            cost_usd=cost,
            usage_estimated=comp.usage_estimated,
            attempts=comp.attempts,
            latency_s=comp.latency_s,
        )
        if self.cache is not None:
            await asyncio.to_thread(self.cache.store, call, meta)
        if self.ledger is not None and ticket is not None:
            self.ledger.settle(ticket, cost)
        return call, False


def _call_usage(call: CachedCall, cached: bool) -> Usage:
    """What one answered call used; a cache hit counts its tokens and cost but pays nothing."""
    return Usage(
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        cost_usd=call.cost_usd,
        paid_usd=0.0 if cached else call.cost_usd,
        calls_paid=0 if cached else 1,
        cache_hits=int(cached),
        paid_prompt_tokens=0 if cached else call.prompt_tokens,
        paid_completion_tokens=0 if cached else call.completion_tokens,
    )


def _log_outcome(stage: str, ids: str, check: Check, attempts: list[Attempt], usage: Usage) -> None:
    """One log line per stage run: ids and counts only, never text (patient text stays out of logs)."""
    log.info(
        "stage=%s %s status=%s reason=%s attempts=%d paid=%d",
        stage,
        ids,
        "accepted" if check.ok else "rejected",
        check.reason or "-",
        len(attempts),
        usage.calls_paid,
    )


class _Flight:
    """One upstream call in flight, shared by the identical calls waiting for it."""

    def __init__(self, task: asyncio.Future):
        self.task = task
        self.waiters = 0
        self.claimed = False  # whether a waiter has taken the answer as its own (not a cache hit)
