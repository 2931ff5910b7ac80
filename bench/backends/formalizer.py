"""`formalizer`: Verdict with a formalizer endpoint - an API teacher or a local vLLM student -
through `verdict.data_gen.formalizer.Formalizer` (the one implementation of prompt -> structured output ->
strict validation -> one repair, with the call cache, ledger and egress allowlist), then the
policy and the core, exactly as the matching service does.

Per pair: the trial is parsed once (shared by its pairs), the inclusion and exclusion value-miner
passes run concurrently, the policy resolves what the note leaves open, the core decides, and
the decision's formal counterfactual is decided again (PivotalFlipRate). The service's opt-in
arbiter and verbalizer (`arbiter`, `verbalizer`, off by default) then run as in the service, their
calls counted as stages of the pair. An output still invalid
after the repair fails the pair (a result, scored as configured); an endpoint that keeps failing
leaves the pair undone for the next run.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..protocol import LabeledPair, PairResult, StageStat
from .base import Backend, BackendConfig, decide_formal, placement_of, register_backend
from .endpoints import EndpointPlacement, EndpointRef, resolve_endpoint


class FormalizerPrompts(BaseModel):
    """The prompt version of each stage (data_gen/formalizer/prompts); the opt-in stages use their v1."""

    model_config = ConfigDict(extra="forbid")
    parser: str = Field("v1", description="trial-parser prompt version")
    miner_inclusion: str = Field("v2", description="inclusion value-miner prompt version (v2: sparse)")
    miner_exclusion: str = Field("v2", description="exclusion value-miner prompt version (v2: sparse)")


class FormalizerConfig(BackendConfig, EndpointPlacement):
    kind: Literal["formalizer"] = "formalizer"
    parser: EndpointRef = Field(
        description="trial-parser endpoint: teacher config name, path or inline mapping"
    )
    miner: EndpointRef = Field(
        description="value-miner endpoint: teacher config name, path or inline mapping"
    )
    prompts: FormalizerPrompts = Field(
        default_factory=FormalizerPrompts, description="prompt version per stage"
    )
    arbiter: bool = Field(
        False,
        description="opt-in extraction-resolution arbiter (paper appendix A.5), as the "
        "service's api.formalizer.arbiter: when mined facts contradict definitional constraints "
        "the miner endpoint re-reads them and the pair is decided again; its calls are counted in "
        "the pair's stages; a failure keeps the solver result",
    )
    verbalizer: bool = Field(
        False,
        description="opt-in verbalizer (paper appendix A.6), as the service's "
        "api.formalizer.verbalizer: restates the decision as prose; it decides nothing, only "
        "its calls are counted in the pair's stages",
    )


def stage_stat(res, cache, shared: bool = False) -> StageStat:
    """A StageResult's outcome and costs; model time from the cache's record of each call."""
    ms = 0.0
    # A stage of several calls (the parser per criterion): its attempts are its calls' attempts, and
    # its first try failed if any call's first try did.
    attempts = [a for r in (res.calls or [res]) for a in r.attempts]
    for a in attempts:
        call = cache.get(a.key) if cache is not None else None
        ms += (call.latency_s if call is not None else 0.0) * 1000
    firsts = [r.attempts[0].reason for r in (res.calls or [res]) if r.attempts]
    u = res.usage
    return StageStat(
        stage=res.stage,
        status=res.status,
        reason=res.reason,
        first_reason=next((x for x in firsts if x is not None), None),
        attempts=len(attempts),
        cached_calls=u.cache_hits,
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        cost_usd=u.cost_usd,
        paid_usd=u.paid_usd,
        model_ms=round(ms, 3),
        shared=shared,
    )


def flip_targets(d) -> dict:
    """The decision's primary δ as flip targets for the end-to-end counterfactual stage: each
    condition stated as the trial's requirement, with the atom's current and target values."""
    from ..protocol import FlipTarget

    if d.decision == "undetermined" or d.pivotal is None or not d.pivotal.conditions:
        return {}
    return {
        "cf_direction": d.pivotal.direction,
        "cf_targets": [
            FlipTarget(
                requirement=c.requirement.text,
                atom=c.atom,
                current=None if c.current is None else str(c.current),
                target=str(c.target),
            )
            for c in d.pivotal.conditions
        ],
    }


class _Overridden:
    """An engine whose decisions apply the arbiter's overrides (the engine's own `arbiter=` hook)."""

    def __init__(self, engine, overrides):
        self.engine, self.overrides = engine, overrides

    def decide(self, program, patient):
        return self.engine.decide(program, patient, None, lambda *_: self.overrides)


@register_backend("formalizer")
class FormalizerBackend(Backend):
    config_class = FormalizerConfig
    formal = True

    def __init__(self, config: FormalizerConfig, ctx):
        super().__init__(config, ctx)
        what = f"backend '{config.name}'"
        self.parser_ep = resolve_endpoint(config.parser, config, ctx.vllm_url, f"{what} parser")
        self.miner_ep = resolve_endpoint(config.miner, config, ctx.vllm_url, f"{what} miner")
        self._fz: dict[tuple[int, str], object] = {}
        self._parses: dict[tuple[int, str], asyncio.Future] = {}

    def preflight(self) -> None:
        self.ctx.egress.check_endpoint(
            self.miner_ep,
            data_class=self.ctx.dataset.data_class,
            what=f"backend '{self.name}' (value miner '{self.miner_ep.name}')",
        )

    def unavailable(self, pair: LabeledPair) -> str | None:
        return self.missing_texts(pair)

    def formalizer(self, repeat: int, role: str):
        key = (repeat, role)
        if key not in self._fz:
            from verdict.data_gen.formalizer import Formalizer

            ep = self.parser_ep if role == "parser" else self.miner_ep
            self._fz[key] = Formalizer(
                ep,
                engine=self.ctx.engine,
                cache=self.ctx.cache(repeat),
                ledger=self.ctx.ledger,
                egress=self.ctx.egress,
                prompts=self.config.prompts.model_dump(),
                run=f"bench:{self.ctx.run_name}",
            )
        return self._fz[key]

    async def parsed(self, trial_id: str, repeat: int = 0):
        """The trial's parse (a StageResult): once per trial and repeat, its pairs (and the bench's
        chart_reading stage) wait on it."""
        key = (repeat, trial_id)
        if key not in self._parses:  # one parse per trial; its pairs wait on it
            self._parses[key] = asyncio.ensure_future(
                self.formalizer(repeat, "parser").parse_trial(self.ctx.dataset.trials[trial_id])
            )
        return await asyncio.shield(self._parses[key])

    async def decide(self, pair: LabeledPair, repeat: int) -> PairResult:
        return await self.decide_note(pair, repeat, self.ctx.dataset.patients[pair.patient_id])

    async def decide_note(self, pair: LabeledPair, repeat: int, note) -> PairResult:
        """Decide the pair on `note` (the dataset's, or a counterfactual rewrite of it)."""
        from verdict.core.errors import PatientError
        from verdict.core.policy import resolve
        from verdict.data_gen.formalizer import merge_sides

        parsed = await self.parsed(pair.trial_id, repeat)
        parser_fz = self.formalizer(repeat, "parser")
        stages = {"parser": stage_stat(parsed, parser_fz.cache, shared=True)}
        if not parsed.accepted:
            return self.failed(
                pair, repeat, f"parser output rejected after one repair ({parsed.reason})", stages=stages
            )
        program = parsed.output
        miner = self.formalizer(repeat, "miner")
        inc, exc = await asyncio.gather(
            miner.mine_values(program, note, "inclusion"), miner.mine_values(program, note, "exclusion")
        )
        for res in (inc, exc):
            stages[res.stage] = stage_stat(res, miner.cache)
        bad = [r for r in (inc, exc) if not r.accepted]
        if bad:
            why = "; ".join(f"{r.stage} output rejected after one repair ({r.reason})" for r in bad)
            return self.failed(pair, repeat, why, stages=stages, program_hash=program.content_hash)
        t0 = time.perf_counter()
        try:
            mined = merge_sides(inc.output, exc.output)  # the service's merge: conflicts stay unresolved
            patient = resolve(
                program,
                pair.patient_id,
                list(mined),
                self.policy,
                held_open=mined.held_open(),
                sources=mined.sources,
            )
        except PatientError as e:
            why = f"value-miner output does not fit the program ({e.summary})"
            return self.failed(pair, repeat, why, stages=stages, program_hash=program.content_hash)
        resolve_ms = (time.perf_counter() - t0) * 1000
        d, flips, solve_ms = await asyncio.to_thread(
            decide_formal, self.ctx.engine, program, patient, pair.pair_id
        )
        miners_ms = max(stages["miner_inclusion"].model_ms, stages["miner_exclusion"].model_ms)
        d, flips, more_ms = await self._optional_stages(
            program, note, patient, d, flips, stages, repeat, pair.pair_id
        )
        solve_ms += more_ms
        miners_ms += sum(stages[s].model_ms for s in ("arbiter", "verbalizer") if s in stages)
        return self.result(
            pair,
            repeat,
            status="decided",
            decision=d.decision,
            stages=stages,
            flips=flips,
            placement=placement_of(d),
            **flip_targets(d),
            solve_ms=round(resolve_ms + solve_ms, 3),
            latency_ms=round(miners_ms + resolve_ms + solve_ms, 3),
            program_hash=program.content_hash,
            patient_hash=d.patient_hash,
        )

    async def _optional_stages(self, program, note, patient, d, flips, stages, repeat, case):
        """The opt-in arbiter and verbalizer, as in the service (serve/optional_stages.py): the
        decision and its flips after them, and the extra solve time in ms. A rejected output keeps
        the solver result."""
        from verdict.data_gen.formalizer import definition_conflicts

        miner, extra_ms = self.formalizer(repeat, "miner"), 0.0
        conflicts = definition_conflicts(d)
        if self.config.arbiter and conflicts:
            res = await miner.arbitrate(program, note, patient, conflicts)
            stages["arbiter"] = stage_stat(res, miner.cache)
            if res.accepted and res.output:
                t0 = time.perf_counter()
                overrides = list(res.output)
                # Decided again with the overrides, and its counterfactual too (the decision it flips).
                d, flips, _ = await asyncio.to_thread(
                    decide_formal, _Overridden(self.ctx.engine, overrides), program, patient, case
                )
                extra_ms += (time.perf_counter() - t0) * 1000
        if self.config.verbalizer:
            res = await miner.verbalize(program, patient, d, data_class=self.ctx.dataset.data_class)
            stages["verbalizer"] = stage_stat(res, miner.cache)
        return d, flips, extra_ms

    async def aclose(self) -> None:
        for t in self._parses.values():
            t.cancel()
        for fz in self._fz.values():
            await fz.aclose()
