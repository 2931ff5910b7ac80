"""What formalizing one (patient, trial) pair cost: model calls, prompt and completion tokens.

A site screens patients x trials, so the figure that matters is the cost per pair, and which part of
it is paid once per patient (reading the chart) rather than once per pair (mining the trial's atoms
against what was read). `PairCost` says both, from the stages' `Usage`:

- `mining`: the value-miner calls this pair sent to a model (both sides; cache hits and atoms reused
  from another trial's mining of the same record are free and counted apart);
- `reading`: the patient's one-time chart reading, whole (None when the chart was mined directly),
  and whether this pair reused a reading another pair paid for.

Only counts and token totals: never text, so a cost can go into responses, logs and metrics.
"""

from __future__ import annotations

from pydantic import Field
from verdict.core.configs import StrictModel

from .protocol import StageResult, Usage


class CallCost(StrictModel):
    """Calls sent to a model and their tokens (cache hits are listed, not counted in the tokens)."""

    calls: int = Field(0, ge=0, description="calls sent to a model (a repair attempt is a call)")
    cache_hits: int = Field(0, ge=0, description="calls answered from the call cache: no model work")
    prompt_tokens: int = Field(0, ge=0, description="prompt tokens of the calls sent")
    completion_tokens: int = Field(0, ge=0, description="completion tokens of the calls sent")

    @classmethod
    def of(cls, usage: Usage) -> CallCost:
        return cls(
            calls=usage.calls_paid,
            cache_hits=usage.cache_hits,
            prompt_tokens=usage.paid_prompt_tokens,
            completion_tokens=usage.paid_completion_tokens,
        )

    def plus(self, other: CallCost) -> CallCost:
        return CallCost(**{k: getattr(self, k) + getattr(other, k) for k in CallCost.model_fields})


class PairCost(StrictModel):
    """The formalizer cost of one pair's decision (the trial's parse is per trial, not here)."""

    mining: CallCost = Field(
        default_factory=CallCost, description="value-miner calls of this pair, both sides"
    )
    reused_atoms: int = Field(
        0, ge=0, description="atoms whose values another trial's mining of this record gave, unasked"
    )
    reading: CallCost | None = Field(
        None,
        description="the one-time reading of this patient's chart (whole, paid once per record "
        "version); null when the chart was mined directly",
    )
    reading_reused: bool = Field(
        False, description="the reading was paid by an earlier pair of this record: this pair paid none"
    )

    def paid(self) -> CallCost:
        """What this pair itself sent: its mining, and the reading if this pair was the one to pay it."""
        if self.reading is None or self.reading_reused:
            return self.mining
        return self.mining.plus(self.reading)


def mining_cost(*sides: StageResult) -> tuple[CallCost, int]:
    """The miner sides' calls (sent and cached) and the atoms they reused from other trials."""
    cost, reused = CallCost(), 0
    for side in sides:
        cost = cost.plus(CallCost.of(side.usage))
        reused += int((side.assembly or {}).get("reused_atoms", 0))
    return cost, reused


def pair_cost(*sides: StageResult) -> PairCost:
    """`PairCost` of a pair from its miner sides; when the chart was read once (`chart_read` on the
    sides), that reading too: this pair paid it unless every side reused a reading made before."""
    mining, reused = mining_cost(*sides)
    reads = [s.chart_read for s in sides if s.chart_read is not None and not s.chart_read.mined_whole]
    if not reads:
        return PairCost(mining=mining, reused_atoms=reused)
    r = reads[0]
    reading = CallCost(
        calls=r.calls,
        cache_hits=r.cache_hits,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
    )
    return PairCost(
        mining=mining, reused_atoms=reused, reading=reading, reading_reused=all(x.reused for x in reads)
    )


def cost_total(costs: list[PairCost]) -> dict[str, float | int]:
    """Totals and per-pair means of what a batch or screen sent: for summaries (counts only)."""
    n = len(costs)
    paid = CallCost()
    readings = 0
    for c in costs:
        paid = paid.plus(c.paid())
        readings += int(c.reading is not None and not c.reading_reused)
    out: dict[str, float | int] = {"pairs": n, "chart_readings": readings, **paid.model_dump()}
    for k in ("calls", "prompt_tokens", "completion_tokens"):
        out[f"{k}_per_pair"] = round(getattr(paid, k) / n, 2) if n else 0
    return out
