"""`recorded`: the paper authors' recorded formalizer outputs (``../shared/data/reference/v6``)
decided by this project's core.

A file ``<patient>/<NCT id>[variant]__full.json`` is one formalization of the trial for that
patient (variants a, b, ... are separate formalizations or sub-cohorts). As the authors did, a
pair is eligible iff some variant is; it is undetermined if none is eligible and some variant hit
a solver limit; it ranks where its best variant ranks in the screen's order. Pairs without a
file are unavailable (not scored for this backend).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..protocol import PAIR_SEP, BenchError, LabeledPair, PairResult
from ..ranking import best_placement
from .base import Backend, BackendConfig, decide_formal, placement_of, register_backend

_STEM = re.compile(r"^(NCT\d+)")


class RecordedConfig(BackendConfig):
    kind: Literal["recorded"] = "recorded"
    path: str = Field(
        "../shared/data/reference/v6", description="folder of <patient>/<trial>[variant]__full.json"
    )


@register_backend("recorded")
class RecordedBackend(Backend):
    config_class = RecordedConfig
    formal = True

    def __init__(self, config: RecordedConfig, ctx):
        super().__init__(config, ctx)
        root = Path(config.path)
        if not root.is_dir():
            raise BenchError(f"backend '{config.name}': reference folder not found: {root}")
        self.files: dict[str, list[Path]] = {}
        for f in sorted(root.glob("*/*__full.json")):
            m = _STEM.match(f.name)
            if m:
                self.files.setdefault(f"{f.parent.name}{PAIR_SEP}{m.group(1)}", []).append(f)
        if not self.files:
            raise BenchError(f"backend '{config.name}': no <patient>/<trial>__full.json files under {root}")

    def unavailable(self, pair: LabeledPair) -> str | None:
        return None if pair.pair_id in self.files else "no recorded formalization of this pair"

    async def decide(self, pair: LabeledPair, repeat: int) -> PairResult:
        return await asyncio.to_thread(self._decide, pair, repeat)

    def _decide(self, pair: LabeledPair, repeat: int) -> PairResult:
        from verdict.core.cases import load_case
        from verdict.core.errors import VerdictError

        decisions, flips, hashes, patients, places = [], [], [], [], []
        solve = 0.0
        for f in self.files[pair.pair_id]:
            try:
                case = load_case(f)
                patient = case.patient_under(self.policy)
            except VerdictError as e:  # a corrupt file fails its pair, visibly
                return self.failed(pair, repeat, f"{f.name}: {e.summary}")
            d, fl, ms = decide_formal(
                self.ctx.engine, case.program, patient, case=f"{f.parent.name}/{f.name}"
            )
            decisions.append(d.decision)
            places.append(placement_of(d))
            flips += fl
            solve += ms
            hashes.append(d.program_hash)
            patients.append(d.patient_hash)
        decision = (
            "eligible"
            if "eligible" in decisions
            else "undetermined"
            if "undetermined" in decisions
            else "ineligible"
        )
        return self.result(
            pair,
            repeat,
            status="decided",
            decision=decision,
            flips=flips,
            solve_ms=solve,
            latency_ms=solve,
            variants=len(decisions),
            placement=best_placement(places),
            program_hash="+".join(hashes),
            patient_hash="+".join(patients),
        )
