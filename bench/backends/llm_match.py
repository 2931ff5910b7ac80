"""`llm_match`: the direct LLM matcher baseline, in the style of the paper's LlmMatch (appendix
B.1): one prompt with the whole note and the whole criteria listing, a per-criterion assessment,
then one verdict, a short rationale and (prompt v2) its own score of how likely the patient is
eligible, as JSON - no program, no solver. The ranking metrics order a topic's trials by that
stated score. It runs on the same
endpoint configs as the formalizer backends, for context.

Adapter: `verdict.data_gen.formalizer.Formalizer` knows the paper's formalizer stages only, so
`DirectMatcher` subclasses it with one more stage, ``llm_match`` (prompt template
`data_gen/formalizer/prompts/llm_match.v<N>.yaml`, its own output limit), and reuses everything else: the
structured-output request, the call cache, the ledger and budget, the egress allowlist, the
validation loop with one repair.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..protocol import LabeledPair, PairResult
from .base import Backend, BackendConfig, register_backend
from .endpoints import EndpointPlacement, EndpointRef, endpoint_with_stages, resolve_endpoint, typed_check

STAGE = "llm_match"


class CriterionAssessment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    criterion: str
    side: Literal["inclusion", "exclusion"]
    status: Literal["met", "not_met", "unknown"]
    justification: str


class LlmMatchOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    criteria: list[CriterionAssessment]
    verdict: Literal["eligible", "ineligible"]
    rationale: str = Field(min_length=1)
    score: int | None = Field(
        None, ge=0, le=100, description="how likely eligible, 0-100 (prompt v2; the bench ranks by it)"
    )


def stated_reasons(out: LlmMatchOutput) -> dict:
    """An ineligible verdict's stated reasons as flip targets (paper D.2): the inclusion criteria it
    found not met and the exclusion criteria it found to apply. An eligible verdict states no
    reason to change, so this matcher is tested in one direction only (ineligible -> eligible)."""
    from ..protocol import FlipTarget

    blockers = [
        c
        for c in out.criteria
        if (c.side == "inclusion" and c.status == "not_met") or (c.side == "exclusion" and c.status == "met")
    ]
    if out.verdict != "ineligible" or not blockers:
        return {}
    return {
        "cf_direction": "to_eligible",
        "cf_targets": [
            FlipTarget(requirement=f"{c.side}: {c.criterion}", status=c.status, current=c.justification)
            for c in blockers
        ],
    }


class LlmMatchConfig(BackendConfig, EndpointPlacement):
    kind: Literal["llm_match"] = "llm_match"
    endpoint: EndpointRef = Field(description="teacher config name, path or inline mapping")
    prompt: str = Field(
        "v2",
        description="version of data_gen/formalizer/prompts/llm_match (v2 adds the score the ranking uses)",
    )
    max_tokens: int = Field(2048, gt=0, description="output limit of the one call")


def _direct_matcher_class():
    from verdict.data_gen.formalizer import Formalizer, load_prompt

    class DirectMatcher(Formalizer):
        def __init__(self, *args, prompt_version: str = "v1", **kw):
            super().__init__(*args, **kw)
            self.match_prompt = load_prompt("llm_match", prompt_version)

        def prompt(self, stage: str):
            return self.match_prompt if stage == STAGE else super().prompt(stage)

        async def match(self, trial, note):
            """Note + criteria -> StageResult whose output is an LlmMatchOutput."""
            messages = self.match_prompt.render(
                NOTE=note.text.strip(),
                TRIAL_ID=trial.trial_id,
                TITLE=trial.title or "(untitled)",
                CRITERIA=trial.criteria_text(),
            )
            limit = self.endpoint.max_tokens.for_stage(STAGE)

            return await self.run_stage(
                STAGE,
                messages,
                LlmMatchOutput.model_json_schema(),
                "llm_match_output",
                typed_check(LlmMatchOutput, limit),
                patient_text=True,
                data_class=note.data_class,
                ids=f"trial={trial.trial_id} patient={note.patient_id}",
                sensitive=(note.text,),
            )

    return DirectMatcher


@register_backend("llm_match")
class LlmMatchBackend(Backend):
    config_class = LlmMatchConfig

    def __init__(self, config: LlmMatchConfig, ctx):
        super().__init__(config, ctx)
        ep = resolve_endpoint(config.endpoint, config, ctx.vllm_url, f"backend '{config.name}'")
        self.endpoint = endpoint_with_stages(ep, {STAGE: config.max_tokens})
        self._matchers: dict[int, object] = {}

    def preflight(self) -> None:
        self.ctx.egress.check_endpoint(
            self.endpoint,
            data_class=self.ctx.dataset.data_class,
            what=f"backend '{self.name}' (endpoint '{self.endpoint.name}')",
        )

    def unavailable(self, pair: LabeledPair) -> str | None:
        return self.missing_texts(pair)

    def matcher(self, repeat: int):
        if repeat not in self._matchers:
            self._matchers[repeat] = _direct_matcher_class()(
                self.endpoint,
                cache=self.ctx.cache(repeat),
                ledger=self.ctx.ledger,
                egress=self.ctx.egress,
                run=f"bench:{self.ctx.run_name}",
                prompt_version=self.config.prompt,
            )
        return self._matchers[repeat]

    async def decide(self, pair: LabeledPair, repeat: int) -> PairResult:
        return await self.decide_note(pair, repeat, self.ctx.dataset.patients[pair.patient_id])

    async def decide_note(self, pair: LabeledPair, repeat: int, note) -> PairResult:
        """Decide the pair on `note` (the dataset's, or a counterfactual rewrite of it)."""
        from .formalizer import stage_stat

        m = self.matcher(repeat)
        res = await m.match(self.ctx.dataset.trials[pair.trial_id], note)
        stat = stage_stat(res, m.cache)
        if not res.accepted:
            why = f"{STAGE} output rejected after one repair ({res.reason})"
            return self.failed(pair, repeat, why, stages={STAGE: stat})
        return self.result(
            pair,
            repeat,
            status="decided",
            decision=res.output.verdict,
            stages={STAGE: stat},
            latency_ms=stat.model_ms,
            rationale=res.output.rationale,
            score=res.output.score,
            **stated_reasons(res.output),
        )

    async def aclose(self) -> None:
        for m in self._matchers.values():
            await m.aclose()
