"""Many (patient, trial) pairs through `MatchingService.match`, streamed as each finishes: the
machinery of `POST /v1/match/batch` (patients x trial ids) and `POST /v1/screen` (a patient x every
registered trial, or a trial x patients).

Each trial's active version is pinned for the whole run (an upload meanwhile changes nothing). At
most `limits.batch_concurrency` pairs are in flight, and a pair is taken from the caller's iterable
only when a slot frees up and the consumer has taken the lines before it: memory is bound by the
concurrency, not by the number of pairs. One pair's failure never stops the others: it is a line
with its own status and error.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Sequence

from .audit import AuditStore
from .error_mapping import error_body, internal_error
from .errors import InvalidInput, ServiceError
from .matching.protocol import BatchLine, BatchRequest, MatchRequest
from .matching.serving import MatchingService
from .protocol import PatientInput

Pair = tuple[int, PatientInput, str]  # (index in the caller's order, patient, trial id)


def pin_trials(audit: AuditStore, trial_ids: Sequence[str]) -> dict[str, str]:
    """Each trial's active version (its program hash), for a whole run; an unknown id is refused,
    named by its place in `trial_ids`, before anything starts."""
    versions, unknown = {}, []
    for i, t in enumerate(trial_ids):
        row = audit.active_trial(t)
        if row is None:
            unknown.append((f"trial_ids.{i}", f"unknown trial '{t}'"))
        else:
            versions[t] = row.program_hash
    if unknown:
        raise InvalidInput("unknown trials in batch: register them with POST /v1/trials", unknown[:50])
    return versions


async def match_pairs(
    service: MatchingService,
    pairs: Iterable[Pair],
    versions: dict[str, str],
    policy: str | None,
    caller: str,
) -> AsyncIterator[BatchLine]:
    """Each pair decided and recorded (`versions`: from `pin_trials`), one line per pair in
    completion order. Closing the stream (the client went away) cancels the pairs in flight and
    starts no more."""
    service.policy(policy)  # an unknown policy is refused before any pair starts

    async def one(index: int, patient: PatientInput, trial_id: str) -> BatchLine:
        line = {"index": index, "patient_id": patient.patient_id, "trial_id": trial_id}
        try:
            req = MatchRequest(
                trial_id=trial_id, program_hash=versions[trial_id], patient=patient, policy=policy
            )
            # pinned: the run's versions were active when it started (serve/trial_versions.py)
            return BatchLine(**line, status=200, result=await service.match(req, caller, "pinned"))
        except ServiceError as e:
            service.metrics.errors.labels(e.code).inc()
            return BatchLine(**line, status=e.status, error=error_body(e))
        except Exception as e:  # noqa: BLE001 - one pair's bug never cuts the others' stream
            service.metrics.errors.labels("internal_error").inc()
            return BatchLine(**line, status=500, error=error_body(internal_error(e)))

    todo = iter(pairs)
    running: set[asyncio.Task[BatchLine]] = set()
    slots = service.config.limits.batch_concurrency
    try:
        while True:
            for pair in itertools.islice(todo, slots - len(running)):
                running.add(asyncio.create_task(one(*pair)))
            if not running:
                return
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: t.result().index):
                yield task.result()
    finally:  # client gone: stop the rest
        for task in running:
            task.cancel()


async def match_batch(service: MatchingService, req: BatchRequest, caller: str) -> AsyncIterator[BatchLine]:
    """`POST /v1/match/batch`: every patient against every trial. The whole batch is checked first
    (size, trial ids, policy: nothing starts if a part is invalid), then streamed."""
    n = len(req.patients) * len(req.trial_ids)
    limit = service.config.limits.max_batch_pairs
    if n > limit:
        raise InvalidInput(
            "batch too large",
            [("patients", f"{len(req.patients)} patients x {len(req.trial_ids)} trials = {n} pairs; "
                          f"the limit is {limit}")],
        )  # fmt: skip
    versions = await asyncio.to_thread(pin_trials, service.audit, req.trial_ids)
    pairs = (
        (i * len(req.trial_ids) + j, p, t)
        for i, p in enumerate(req.patients)
        for j, t in enumerate(req.trial_ids)
    )
    async for line in match_pairs(service, pairs, versions, req.policy, caller):
        yield line
