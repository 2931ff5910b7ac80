"""Site-wide screening: the pairs go through the batch path (`MatchingService.match_batch`: one
version per trial pinned for the run, bounded concurrency, one pair's failure never stops the
others, every decision recorded), then the core ranks the decisions (`verdict.core.ranking`), and
the run itself is recorded after its pairs (`screenings`, in the audit chain): its source as the
caller stated it, the counts, the decision ids and the policy."""

from __future__ import annotations

import asyncio
from collections import Counter

from verdict.core.ranking import rank

from ..errors import InvalidInput, NotFound
from ..protocol import BatchRequest
from ..serving import MatchingService
from .protocol import (
    ScreenFailure,
    ScreeningCounts,
    ScreeningRecord,
    ScreeningSubjects,
    ScreenLinks,
    ScreenRequest,
    ScreenResponse,
    ScreenRow,
    ScreenSource,
)


def screen_batch(service: MatchingService, req: ScreenRequest) -> BatchRequest:
    """The pairs of a screen as a batch: a patient x the registered trials, or patients x one trial."""
    if req.direction == "trial":
        return BatchRequest(patients=req.patients, trial_ids=[req.trial_id], policy=req.policy)
    trial_ids = req.trial_ids if req.trial_ids is not None else service.audit.trial_ids()
    if not trial_ids:
        raise InvalidInput(
            "no trials to screen against",
            [("trial_ids", "no trial is registered yet: POST /v1/trials first")],
        )
    return BatchRequest(patients=[req.patient], trial_ids=trial_ids, policy=req.policy)


async def screen(service: MatchingService, req: ScreenRequest, caller: str) -> ScreenResponse:
    results, failures = [], []
    async for line in service.match_batch(screen_batch(service, req), caller):
        if line.result is not None:
            results.append(line.result)
        else:
            failures.append(
                ScreenFailure(
                    trial_id=line.trial_id, patient_id=line.patient_id, status=line.status, error=line.error
                )
            )
    by_pair = {(r.trial_id, r.patient_id): r for r in results}
    rows = []
    for ranked in rank([r.decision for r in results]):
        r = by_pair[(ranked.trial_id, ranked.patient_id)]
        rows.append(
            ScreenRow(
                **ranked.model_dump(),
                decision_id=r.decision_id,
                program_hash=r.program_hash,
                links=ScreenLinks(decision=r.links.decision, page=r.links.page),
            )
        )
    failures.sort(key=lambda f: (f.trial_id, f.patient_id))
    tiers = dict(Counter(r.tier for r in rows))
    source = req.source or ScreenSource(kind="api")
    policy = service.policy(req.policy)
    run = await asyncio.to_thread(
        service.audit.add_screening, created_by=caller, direction=req.direction, source_kind=source.kind,
        source_label=source.label, policy_name=policy.name, policy_version=policy.version,
        counts=ScreeningCounts(pairs=len(rows) + len(failures), ranked=tiers,
                               failures=len(failures)).model_dump(),
        decision_ids=[r.decision_id for r in rows],
    )  # fmt: skip
    return ScreenResponse(
        direction=req.direction,
        rows=rows,
        failures=failures,
        tiers=tiers,
        pairs=len(rows) + len(failures),
        screening_id=run.screening_id,
    )


def screening_record(service: MatchingService, screening_id: str) -> ScreeningRecord:
    row = service.audit.screening(screening_id)
    if row is None:
        raise NotFound(f"no screening '{screening_id}'")
    return ScreeningRecord(
        screening_id=row.screening_id, created_at=row.created_at, created_by=row.created_by,
        direction=row.direction, source=ScreenSource(kind=row.source_kind, label=row.source_label),
        counts=ScreeningCounts.model_validate(row.counts), decision_ids=row.decision_ids,
        policy={"name": row.policy_name, "version": row.policy_version},
    )  # fmt: skip


def screening_subjects(service: MatchingService, screening_id: str, service_url: str) -> ScreeningSubjects:
    """The ResearchSubjects of a recorded run, from its decisions as recorded (status from each
    decision, links to this service at `service_url`)."""
    from .research_subjects import DECISION_STATUS, subject

    row = service.audit.screening(screening_id)
    if row is None:
        raise NotFound(f"no screening '{screening_id}'")
    out = []
    for decision_id in row.decision_ids:
        d = service.audit.decision(decision_id)
        if d is None:  # the store is append-only: a recorded run's decisions stay
            raise NotFound(f"screening '{screening_id}' names a decision '{decision_id}' that is not stored")
        links = {"decision": f"/v1/decisions/{decision_id}", "page": f"/v1/decisions/{decision_id}/page"}
        rs = subject(
            decision_id=decision_id,
            trial_id=d.trial_id,
            patient_id=d.patient_id,
            status=DECISION_STATUS[d.decision],
            links=links,
            service_url=service_url,
        )
        resource = rs.model_dump(mode="json", exclude_none=True)
        resource.pop("id")  # the FHIR server assigns it: a conditional update refuses a client id
        out.append(resource)
    return ScreeningSubjects(screening_id=screening_id, research_subjects=out)
