"""One formalizer stage as the service runs it: the call awaited, its failure mapped to an HTTP error,
its time, tokens and repairs counted.

Down or slow -> FormalizerUnavailable (503 + Retry-After); an output still invalid after the repair,
or an error retrying cannot fix -> FormalizerFailed (502). Upstream text (servers echo prompts) never
passes through; for a stage that read a note, neither do the checks' messages (they can quote it).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable

from verdict.data_gen.formalizer import MINER_BUDGET, EgressRefused, EndpointError, StageResult

from .errors import FormalizerFailed, FormalizerUnavailable
from .metrics import ServiceMetrics

log = logging.getLogger("verdict.serve")


class StageRunner:
    def __init__(self, metrics: ServiceMetrics, timeout_s: float, retry_after_s: int):
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s

    async def run(self, call: Awaitable[StageResult], stage: str, note: str | None = None) -> StageResult:
        """The stage's accepted result; `note`: the patient text it read (never quoted in an error)."""
        t0 = time.perf_counter()
        try:
            res: StageResult = await call
        except EndpointError as e:
            raise self.unavailable_or_failed(e, stage) from None
        except EgressRefused as e:
            raise FormalizerFailed(str(e)) from None
        finally:
            self.metrics.observe_stage(stage, time.perf_counter() - t0)
        self.metrics.tokens.labels(stage, "prompt").inc(res.usage.prompt_tokens)
        self.metrics.tokens.labels(stage, "completion").inc(res.usage.completion_tokens)
        if any(len(c.attempts) > 1 for c in res.calls or [res]):  # a stage of several calls: any repaired
            self.metrics.repairs.labels(stage, res.status).inc()
        if res.reason == MINER_BUDGET:  # no call was made: the side's atoms cannot fit the limits
            raise FormalizerFailed(
                f"the {stage} stage cannot be asked within the students' token limits",
                [(stage, p) for p in res.problems],
            )
        if not res.accepted:
            raise rejected(res, stage, note)
        return res

    def unavailable_or_failed(self, e: EndpointError, stage: str) -> FormalizerUnavailable | FormalizerFailed:
        """An endpoint error as a fixed message: stage, status, reference (logged with the reference)."""
        ref, what = uuid.uuid4().hex[:12], endpoint_failure(e, self.timeout_s)
        log.warning(
            "stage=%s formalizer error ref=%s status=%s retryable=%s: %s",
            stage,
            ref,
            e.status,
            e.retryable,
            what,
        )
        if e.retryable:
            return FormalizerUnavailable(
                f"the formalizer ({stage}) is unavailable: {what} (reference {ref})",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        return FormalizerFailed(f"the formalizer ({stage}) failed: {what} (reference {ref})")


def rejected(res: StageResult, stage: str, note: str | None) -> FormalizerFailed:
    """An output still invalid after the repair, as a 502 naming its problems (counted only when the
    stage read a note: the checks' messages can carry model output, which can quote it)."""
    ref = uuid.uuid4().hex[:12]
    log.warning("stage=%s rejected after repair reason=%s ref=%s", stage, res.reason, ref)
    problems = (
        [
            (
                stage,
                f"{len(res.problems)} problem(s), first reason '{res.reason}' (details withheld: "
                f"the output may quote the note; reference {ref})",
            )
        ]
        if note
        else [(stage, p) for p in res.problems][:20]
    )
    # a stage of several calls: which ones failed (document, passage, chunk ids; no text)
    failed = [c for c in res.calls if not c.accepted]
    problems += [(stage, f"call {c.item} rejected (reason: {c.reason})") for c in failed][:20]
    return FormalizerFailed(
        f"the {stage} output failed validation after one repair attempt (reason: {res.reason})", problems
    )


def endpoint_failure(e: EndpointError, timeout_s: float) -> str:
    """What went wrong with a formalizer call, in the service's own words (never the server's)."""
    text = str(e)
    if e.status is not None:
        return f"HTTP {e.status} from the formalizer"
    if "no answer within" in text:
        return f"no answer within {timeout_s:g} s"
    if "no formalizer endpoint available" in text or "every formalizer endpoint failed" in text:
        return "no formalizer endpoint available"
    if "connection failed" in text:
        return "connection failed"
    return "no usable answer"
