"""`predictions`: pair decisions another system already made, read from a JSONL file, so that
they are scored on the same pairs and compared with McNemar's test (e.g. the paper authors'
recorded pair decisions, ``../shared/data/reference/verdicts.jsonl``).

Rows: {"pair": "<patient>__<trial>"} or {"patient_id", "trial_id" (or "nct_id")}, plus the
decision in "eligibility" or "decision": eligible | ineligible | undetermined (or true/false).
A malformed row is reported and skipped; a pair without a row is unavailable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..protocol import PAIR_SEP, BenchError, LabeledPair, PairResult, pair_id
from .base import Backend, BackendConfig, register_backend

_VALUES = {
    "eligible": "eligible",
    "ineligible": "ineligible",
    "undetermined": "undetermined",
    True: "eligible",
    False: "ineligible",
}


class PredictionsConfig(BackendConfig):
    kind: Literal["predictions"] = "predictions"
    path: str = Field(description="JSONL of pair decisions")


@register_backend("predictions")
class PredictionsBackend(Backend):
    config_class = PredictionsConfig

    def __init__(self, config: PredictionsConfig, ctx):
        super().__init__(config, ctx)
        path = Path(config.path)
        if not path.is_file():
            raise BenchError(f"backend '{config.name}': predictions file not found: {path}")
        self.decisions: dict[str, str] = {}
        self._problems: list[str] = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{config.name}: {path.name}:{n}"
            try:
                row = json.loads(line)
            except ValueError as e:
                self._problems.append(f"{where}: not valid JSON ({e.msg})")
                continue
            if not isinstance(row, dict):
                self._problems.append(f"{where}: expected a JSON object")
                continue
            key = row.get("pair")
            if not isinstance(key, str) or PAIR_SEP not in key:
                pid, tid = row.get("patient_id"), row.get("trial_id") or row.get("nct_id")
                key = pair_id(pid, tid) if isinstance(pid, str) and isinstance(tid, str) else None
            value = row.get("eligibility", row.get("decision"))
            value = _VALUES.get(value) if isinstance(value, (str, bool)) else None
            if key is None:
                self._problems.append(f"{where}: needs 'pair' or 'patient_id' and 'trial_id'")
            elif value is None:
                self._problems.append(f"{where}: 'eligibility' must be eligible, ineligible or undetermined")
            elif key in self.decisions and self.decisions[key] != value:
                self._problems.append(f"{where}: pair '{key}' repeats with another decision (first kept)")
            else:
                self.decisions.setdefault(key, value)

    def problems(self) -> list[str]:
        return list(self._problems)

    def unavailable(self, pair: LabeledPair) -> str | None:
        return None if pair.pair_id in self.decisions else "no recorded decision for this pair"

    async def decide(self, pair: LabeledPair, repeat: int) -> PairResult:
        return self.result(pair, repeat, status="decided", decision=self.decisions[pair.pair_id])
