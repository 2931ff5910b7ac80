"""The service's opt-in formalizer stages (paper appendix A.5, A.6), off by default:

- the extraction-resolution **arbiter** (`api.formalizer.arbiter`): asked only when the core set
  facts aside because they contradict the program's definitional constraints; its overrides are
  applied by the engine's own `arbiter=` hook and the pair is decided again;
- the **verbalizer** (`api.formalizer.verbalizer`): restates the core's decision as prose
  (`MatchResponse.rationale_text`); it decides nothing, and the structured rationale stays the
  source of truth.

Both are asked of the value-miner adapter. Neither can fail a match: a rejected output or an
endpoint error keeps the solver's result and says so in the stage's record (no note text in it,
nor in the log: the service's stage runner withholds the checker's messages).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from verdict.core.decision import Decision
from verdict.core.patient import ResolvedPatient
from verdict.core.program import TrialProgram
from verdict.core.solver_pool import SolverPool
from verdict.data_gen.formalizer import Formalizer, PatientDoc, StageResult, definition_conflicts, redecide

from .api_config import FormalizerConfig
from .errors import FormalizerFailed, FormalizerUnavailable, ServiceError
from .stage_runner import StageRunner

log = logging.getLogger("verdict.serve")


@dataclass(frozen=True)
class DecidedPair:
    """A pair as the core decided it: what both stages read."""

    program: TrialProgram
    record: PatientDoc
    patient: ResolvedPatient
    decision: Decision


class OptionalStages:
    """Both stages, asked of the value miner through the service's stage runner."""

    def __init__(self, config: FormalizerConfig, miner: Formalizer, engine: SolverPool, stages: StageRunner):
        self.config = config
        self.miner = miner
        self.engine = engine
        self.stages = stages

    async def arbitrate(self, d: DecidedPair, timings: dict[str, float]) -> tuple[DecidedPair, dict | None]:
        """The pair after the arbiter (decided again, or the same), and what the arbiter did: None when
        it was not asked (off, or no fact contradicts a definition)."""
        conflicts = definition_conflicts(d.decision)
        if not self.config.arbiter or not conflicts:
            return d, None
        asked = self.miner.arbitrate(d.program, d.record, d.patient, conflicts)
        res, failed = await self._ask("arbiter", asked, d.record, timings)
        if failed is not None:
            log.warning("arbiter failed (%s); the solver result is kept", failed.code)
            return d, {"status": "failed", "overrides": [], "problem": failed.summary}
        stage = {"prompt": res.prompt_version, "attempts": len(res.attempts)}
        if not res.output:  # no faithful correction: the solver result stands (appendix A.5)
            return d, {"status": "no_override", "overrides": [], **stage}
        t0 = time.perf_counter()
        # The engine applies the overrides itself (its arbiter hook), as any caller of decide would.
        again, applied = await redecide(self.engine.adecide, d.program, d.patient, res)
        timings["solve"] = round(timings.get("solve", 0.0) + _ms(t0), 3)
        return dataclasses.replace(d, decision=again), {"status": "applied", "overrides": applied, **stage}

    async def verbalize(self, d: DecidedPair, timings: dict[str, float]) -> tuple[str | None, dict | None]:
        """The verbalizer's rationale text (None when off or rejected) and its record (None when off)."""
        if not self.config.verbalizer:
            return None, None
        asked = self.miner.verbalize(d.program, d.patient, d.decision, data_class=d.record.data_class)
        res, failed = await self._ask("verbalizer", asked, d.record, timings)
        if failed is not None:
            log.warning("verbalizer failed (%s); no rationale text", failed.code)
            return None, {"status": "failed", "problem": failed.summary}
        return res.output, {"status": "accepted", "prompt": res.prompt_version, "attempts": len(res.attempts)}

    async def _ask(
        self, stage: str, asked: Awaitable[StageResult], record: PatientDoc, timings: dict[str, float]
    ) -> tuple[StageResult, None] | tuple[None, ServiceError]:
        """The stage's result, or the error that keeps the solver's result (timed in `timings[stage]`)."""
        t0 = time.perf_counter()
        try:
            return await self.stages.run(asked, stage, record.text), None
        except (FormalizerFailed, FormalizerUnavailable) as e:
            return None, e
        finally:
            timings[stage] = _ms(t0)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
