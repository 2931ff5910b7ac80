"""End-to-end counterfactual self-faithfulness (paper §5.4, appendix D): does the decision still
flip when the chart itself changes?

For every pair a backend decided with flip targets (`formalizer`: its primary δ, each condition
stated as the trial's requirement with the atom's current and target values, both directions;
`llm_match`: the criteria it stated as reasons for an ineligible verdict, one direction):
1. the modifier endpoint rewrites the chart minimally to address the targets
   (`data_gen/formalizer/prompts/cf_modifier`);
2. the validator endpoint checks the rewrite: addresses the targets, changes nothing else bearing
   on eligibility, adds no blocker, stays clinically coherent (`cf_validator`); a rejected rewrite
   is left out of SF_raw's denominator and counted with the failed check;
3. the same backend decides the pair again on the rewritten chart (the formal backend through its
   value miner, with the trial's cached program);
4. SF_raw = flipped / validator-accepted, with a Wilson 95% interval (D.4), per backend and
   direction.

Neither the modifier nor the validator sees the matcher's verdict. Every call goes through the
formalizer runtime (call cache, ledger and budget, egress allowlist: the chart is patient text),
and each counterfactual is appended to `counterfactual.jsonl` as it finishes, so a rerun from the
run's config.yaml pays nothing and a stopped run resumes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from verdict.core.configs import StrictModel
from verdict.core.jsonl_store import JsonlStore

from .backends.endpoints import (
    EndpointPlacement,
    EndpointRef,
    endpoint_with_stages,
    resolve_endpoint,
    typed_check,
)
from .markdown import rate_text, section, side_by_side, table
from .pending import Pending
from .protocol import CfRecord, FlipTarget, PairResult

CF_FILE = "counterfactual.jsonl"
KINDS = ("formalizer", "llm_match")  # the backends that can run again on a new chart
MODIFIER, VALIDATOR = "cf_modifier", "cf_validator"
CHECKS = ("addresses_targets", "unrelated_changes", "new_blocker", "coherent")
# The paper's raw flip rates (Table 18, GPT-5 modifier / GPT-5 validator; ineligible -> eligible).
PAPER = [
    {"label": "paper Table 18: Verdict-E2E", "k": 327, "n": 388, "rate": 0.843},
    {"label": "paper Table 18: LlmMatch", "k": 227, "n": 464, "rate": 0.489},
    {"label": "paper Table 18: LlmMatch-Pivotal", "k": 466, "n": 807, "rate": 0.577},
    {"label": "paper Table 18: TrialGPT", "k": 366, "n": 599, "rate": 0.611},
]


class CfPrompts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    modifier: str = "v1"
    validator: str = "v1"


class CounterfactualConfig(StrictModel, EndpointPlacement):
    enabled: bool = Field(False, description="run the end-to-end counterfactual stage after the backends")
    modifier: EndpointRef | None = Field(None, description="the chart modifier's endpoint")
    validator: EndpointRef | None = Field(None, description="the validator's endpoint")
    prompts: CfPrompts = Field(default_factory=CfPrompts)
    directions: list[Literal["to_eligible", "to_ineligible"]] = Field(
        default_factory=lambda: ["to_eligible", "to_ineligible"]
    )
    backends: list[str] | None = Field(None, description="only these backends (default: every one it fits)")
    max_tokens: int = Field(4096, gt=0, description="output limit of the modifier and the validator")


class ModifierOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    modified_note: str = Field(min_length=1)
    edits: list[str] = Field(default_factory=list)


class ValidatorOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    addresses_targets: bool
    unrelated_changes: bool
    new_blocker: bool
    coherent: bool
    reason: str = ""

    def failed(self) -> list[str]:
        out = [] if self.addresses_targets else ["does not address the targets"]
        out += ["changes another eligibility fact"] if self.unrelated_changes else []
        out += ["adds a new blocker"] if self.new_blocker else []
        return out + ([] if self.coherent else ["not clinically coherent"])


def cf_store(run_dir: Path) -> JsonlStore[CfRecord]:
    return JsonlStore(Path(run_dir) / CF_FILE, CfRecord, exclude_defaults=True)


def _targets_text(targets: list[FlipTarget]) -> tuple[str, str]:
    if targets and targets[0].atom is not None:
        lines = [
            f"- {t.requirement} (atom {t.atom}: now {t.current or 'not stated'}, needed {t.target})"
            for t in targets
        ]
        return "\n".join(lines), "the matcher's formal conditions"
    return "\n".join(f"- {t.requirement} (stated: {t.current or t.status})" for t in targets), (
        "the matcher's stated reasons"
    )


GOAL = {
    "to_eligible": "meet these requirements, so that they no longer stand in the way of eligibility",
    "to_ineligible": "stop meeting these requirements as stated",
}


def _caller_class():
    from verdict.data_gen.formalizer import Formalizer, load_prompt

    class CfCaller(Formalizer):
        """The formalizer runtime with the two counterfactual stages (cache, ledger, egress)."""

        def __init__(self, *args, versions: CfPrompts, **kw):
            super().__init__(*args, **kw)
            self.cf_prompts = {
                MODIFIER: load_prompt(MODIFIER, versions.modifier),
                VALIDATOR: load_prompt(VALIDATOR, versions.validator),
            }

        def prompt(self, stage: str):
            return self.cf_prompts.get(stage) or super().prompt(stage)

        async def call(self, stage: str, model, note, trial, targets, direction, **slots):
            text, kind = _targets_text(targets)
            messages = self.cf_prompts[stage].render(
                NOTE=note.text.strip(),
                TRIAL_ID=trial.trial_id,
                TITLE=trial.title or "(untitled)",
                CRITERIA=trial.criteria_text(),
                TARGETS=text,
                TARGET_KIND=kind,
                GOAL=GOAL[direction],
                **slots,
            )
            limit = self.endpoint.max_tokens.for_stage(stage)

            return await self.run_stage(
                stage,
                messages,
                model.model_json_schema(),
                f"{stage}_output",
                typed_check(model, limit),
                patient_text=True,
                data_class=note.data_class,
                ids=f"trial={trial.trial_id} patient={note.patient_id}",
                sensitive=(note.text, *slots.values()),
            )

    return CfCaller


class CounterfactualStage:
    def __init__(self, config: CounterfactualConfig, ctx, backends: list, concurrency: int):
        self.config, self.ctx, self.concurrency = config, ctx, concurrency
        wanted = set(config.backends) if config.backends is not None else None
        self.backends = [b for b in backends if b.kind in KINDS and (wanted is None or b.name in wanted)]
        self.endpoints = {}
        for role, ref in (("modifier", config.modifier), ("validator", config.validator)):
            if ref is None:
                from .protocol import BenchError

                raise BenchError(f"counterfactual.enabled needs counterfactual.{role} (an endpoint)")
            ep = resolve_endpoint(ref, config, ctx.vllm_url, f"counterfactual {role}")
            self.endpoints[role] = endpoint_with_stages(
                ep, {MODIFIER: config.max_tokens, VALIDATOR: config.max_tokens}
            )
        self._callers: dict[str, object] = {}

    def preflight(self) -> None:
        for role, ep in self.endpoints.items():
            self.ctx.egress.check_endpoint(
                ep, data_class=self.ctx.dataset.data_class, what=f"counterfactual {role} '{ep.name}'"
            )

    def caller(self, role: str):
        if role not in self._callers:
            self._callers[role] = _caller_class()(
                self.endpoints[role],
                cache=self.ctx.cache(0),
                ledger=self.ctx.ledger,
                egress=self.ctx.egress,
                run=f"bench:{self.ctx.run_name}",
                versions=self.config.prompts,
            )
        return self._callers[role]

    def todo(self, results: dict) -> list[tuple[object, PairResult]]:
        out = []
        for b in self.backends:
            for (name, repeat, _), r in sorted(results.items()):
                if (
                    name == b.name
                    and repeat == 0
                    and not r.ranking_only
                    and r.status == "decided"
                    and r.cf_targets
                    and r.cf_direction in self.config.directions
                ):
                    out.append((b, r))
        return out

    async def one(self, backend, r: PairResult) -> CfRecord:
        from .backends.formalizer import stage_stat

        ds = self.ctx.dataset
        note, trial = ds.patients[r.patient_id], ds.trials[r.trial_id]
        rec = dict(
            backend=backend.name,
            pair_id=r.pair_id,
            patient_id=r.patient_id,
            trial_id=r.trial_id,
            direction=r.cf_direction,
            targets=len(r.cf_targets),
        )
        modifier = self.caller("modifier")
        mod = await modifier.call(MODIFIER, ModifierOutput, note, trial, r.cf_targets, r.cf_direction)
        stages = {MODIFIER: stage_stat(mod, modifier.cache)}
        if not mod.accepted:
            return CfRecord(
                **rec, status="failed", stages=stages, reason=f"modifier output invalid ({mod.reason})"
            )
        new_text = mod.output.modified_note
        validator = self.caller("validator")
        val = await validator.call(
            VALIDATOR, ValidatorOutput, note, trial, r.cf_targets, r.cf_direction, MODIFIED=new_text
        )
        stages[VALIDATOR] = stage_stat(val, validator.cache)
        if not val.accepted:
            return CfRecord(
                **rec, status="failed", stages=stages, reason=f"validator output invalid ({val.reason})"
            )
        if failed := val.output.failed():
            return CfRecord(**rec, status="rejected", stages=stages, reason="; ".join(failed))
        pair = next(p for p in ds.all_pairs if p.pair_id == r.pair_id)
        again = await backend.decide_note(
            pair, 0, note.model_copy(update={"text": new_text, "documents": None})
        )
        stages.update({f"rerun_{k}": v for k, v in again.stages.items() if not v.shared})
        if again.status != "decided":
            return CfRecord(**rec, status="failed", stages=stages, reason=f"rerun failed ({again.reason})")
        target = "eligible" if r.cf_direction == "to_eligible" else "ineligible"
        return CfRecord(
            **rec,
            status="flipped" if again.decision == target else "not_flipped",
            decision_after=again.decision,
            stages=stages,
        )

    async def run(self, results: dict, run_dir: Path) -> tuple[str | None, float, int]:
        """Every pending counterfactual: (the budget stop's message if it stopped there, paid USD,
        counterfactuals left for the next run after endpoint errors)."""
        store = cf_store(run_dir)
        done = {x.key for x in store.load()}
        todo = [(b, r) for b, r in self.todo(results) if (b.name, r.pair_id, r.cf_direction) not in done]
        sem = asyncio.Semaphore(self.concurrency)
        state = Pending()

        async def go(b, r):
            async with sem:
                if state.halted:
                    return
                with state.item(f"counterfactual {r.pair_id} on {b.name}"):
                    rec = await self.one(b, r)
                    store.append(rec)
                    state.paid += sum(s.paid_usd for s in rec.stages.values())

        try:
            await asyncio.gather(*(go(b, r) for b, r in todo))
        finally:
            store.close()
            for c in self._callers.values():
                await c.aclose()
        return state.stop, state.paid, state.failed


def summarize_cf(run_dir: Path, config) -> dict | None:
    """SF_raw per backend and direction (Wilson 95%), rewrites failed and rejected by reason."""
    from collections import Counter

    from .metrics import rate

    cfg = getattr(config, "counterfactual", None)
    if cfg is None or not cfg.enabled:
        return None
    path = Path(run_dir) / CF_FILE
    recs = list(cf_store(run_dir).latest(lambda x: x.key).values()) if path.exists() else []
    rows = {}
    for key in sorted({(x.backend, x.direction) for x in recs}):
        xs = [x for x in recs if (x.backend, x.direction) == key]
        valid = [x for x in xs if x.status in ("flipped", "not_flipped")]
        rows[f"{key[0]} {key[1]}"] = {
            "backend": key[0],
            "direction": key[1],
            "attempted": len(xs),
            "valid": len(valid),
            "flipped": sum(x.status == "flipped" for x in xs),
            "sf_raw": rate(sum(x.status == "flipped" for x in xs), len(valid)),
            "rejected": dict(Counter(x.reason for x in xs if x.status == "rejected")),
            "failed": dict(Counter(x.reason for x in xs if x.status == "failed")),
            "cost_usd": sum(s.cost_usd for x in xs for s in x.stages.values()),
        }
    return {"rows": rows, "paper": PAPER}


def render_cf(s: dict, machinery_check: bool) -> list[str]:
    cf = s.get("counterfactual")
    if not cf:
        return []
    intro = (
        "Each pair's flip targets (formal: the primary δ as the trial's requirements; llm_match: its "
        "stated reasons) -> the modifier rewrites the chart -> the validator checks it -> the same "
        "backend decides again on the new chart. SF_raw = flipped / validator-accepted (Wilson 95% CI); "
        "rejected rewrites are left out of the denominator (paper D.1)."
    )
    columns = (
        "backend | direction | rewrites | accepted | flipped | SF_raw [95% CI] | rejected (why) | "
        "failed (why)"
    )
    lines = section("End-to-end counterfactual self-faithfulness", columns, [intro])
    why = lambda d: "; ".join(f"{k}: {v}" for k, v in d.items()) or "0"  # noqa: E731
    for x in cf["rows"].values():
        lines.append(
            f"| {x['backend']} | {x['direction']} | {x['attempted']} | {x['valid']} | {x['flipped']} | "
            f"{rate_text(x['sf_raw'])} | {sum(x['rejected'].values())} ({why(x['rejected'])}) | "
            f"{sum(x['failed'].values())} ({why(x['failed'])}) |"
        )
    if not cf["rows"]:
        lines.append("| (no pair with flip targets) | | | | | | | |")
    if machinery_check:
        lines += ["", "Machinery check: the paper's figures are not set beside these."]
    else:
        lines += [
            "",
            "The paper's raw ineligible -> eligible flip rates (Table 18, GPT-5 modifier and validator; "
            "not measured here):",
            "",
            *table("source | flipped / accepted | SF_raw"),
        ]
        lines += [f"| {p['label']} | {p['k']}/{p['n']} | {p['rate']:.1%} |" for p in cf["paper"]]
    return lines


def compare_cf(a: dict, b: dict) -> list[str]:
    """Both runs' SF_raw rows side by side (`verdict bench compare`)."""
    columns = "backend | direction | rewrites | accepted | SF_raw [95% CI]"
    title = "End-to-end counterfactual self-faithfulness:"
    return side_by_side(a, b, "counterfactual", title, columns, _compared_rows)


def _compared_rows(cf: dict) -> list[list]:
    """A run's SF_raw rows as `verdict bench compare` shows them."""
    return [
        [x["backend"], x["direction"], x["attempted"], x["valid"], rate_text(x["sf_raw"])]
        for x in (cf.get("rows") or {}).values()
    ]
