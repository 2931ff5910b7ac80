"""Site-wide screening: the pairs go through the batch path (`MatchingService.match_batch`: one
version per trial pinned for the run, bounded concurrency, one pair's failure never stops the
others, every decision recorded), then the core ranks the decisions (`verdict_core.ranking`)."""

from __future__ import annotations

from collections import Counter

from verdict_core.ranking import rank

from ..errors import InvalidInput
from ..protocol import BatchRequest
from ..serving import MatchingService
from .protocol import ScreenFailure, ScreenLinks, ScreenRequest, ScreenResponse, ScreenRow


def screen_batch(service: MatchingService, req: ScreenRequest) -> BatchRequest:
    """The pairs of a screen as a batch: a patient x the registered trials, or patients x one trial."""
    if req.direction == "trial":
        return BatchRequest(patients=req.patients, trial_ids=[req.trial_id], policy=req.policy)
    trial_ids = req.trial_ids if req.trial_ids is not None else service.audit.trial_ids()
    if not trial_ids:
        raise InvalidInput("no trials to screen against", [("trial_ids", "no trial is registered yet: "
                                                                         "POST /v1/trials first")])
    return BatchRequest(patients=[req.patient], trial_ids=trial_ids, policy=req.policy)


async def screen(service: MatchingService, req: ScreenRequest, caller: str) -> ScreenResponse:
    results, failures = [], []
    async for line in service.match_batch(screen_batch(service, req), caller):
        if line.result is not None:
            results.append(line.result)
        else:
            failures.append(ScreenFailure(trial_id=line.trial_id, patient_id=line.patient_id, status=line.status,
                                          error=line.error))
    by_pair = {(r.trial_id, r.patient_id): r for r in results}
    rows = []
    for ranked in rank([r.decision for r in results]):
        r = by_pair[(ranked.trial_id, ranked.patient_id)]
        rows.append(ScreenRow(**ranked.model_dump(), decision_id=r.decision_id, program_hash=r.program_hash,
                              links=ScreenLinks(decision=r.links.decision, page=r.links.page)))
    failures.sort(key=lambda f: (f.trial_id, f.patient_id))
    return ScreenResponse(direction=req.direction, rows=rows, failures=failures,
                          tiers=dict(Counter(r.tier for r in rows)), pairs=len(rows) + len(failures))
