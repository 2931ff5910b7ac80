"""Site-wide screening: the pairs stream through the batch path (`serve/pairs.py`: one version per
trial pinned for the run, at most `limits.batch_concurrency` pairs in flight, one pair's failure
never stops the others, every decision recorded), however many trials are registered. Each decision
is ranked as it finishes and only its row is kept (`verdict.core.ranking.rank`, then `rerank`), never
the whole answer, so memory grows by a small row per pair. The run itself is recorded after its pairs
(`screenings`, in the audit chain): its source as the caller stated it, the counts, every ranked
decision id best first, and the policy."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

from verdict.core.ranking import rank, rerank

from ..errors import InvalidInput, NotFound
from ..matching.protocol import Links
from ..matching.serving import MatchingService
from ..pairs import Pair, match_pairs, pin_trials
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
from .research_subjects import DECISION_STATUS, subject


def screen_plan(service: MatchingService, req: ScreenRequest) -> tuple[list[str], Iterator[Pair]]:
    """The trial ids of a screen and its pairs (a patient x the trials, or patients x one trial),
    checked against `limits.max_screen_pairs`. Reads the store: call it in a thread."""
    if req.direction == "trial":
        trial_ids, field, n = [req.trial_id], "patients", len(req.patients)
        pairs = ((i, p, req.trial_id) for i, p in enumerate(req.patients))
    else:
        trial_ids = req.trial_ids if req.trial_ids is not None else service.audit.trial_ids()
        if not trial_ids:
            raise InvalidInput(
                "no trials to screen against",
                [("trial_ids", "no trial is registered yet: POST /v1/trials first")],
            )
        field, n = "trial_ids", len(trial_ids)
        pairs = ((j, req.patient, t) for j, t in enumerate(trial_ids))
    limit = service.config.limits.max_screen_pairs
    if n > limit:
        raise InvalidInput(
            "screen too large",
            [(field, f"{n} pairs to screen; the limit is {limit} (limits.max_screen_pairs)")],
        )
    return trial_ids, pairs


async def screen(service: MatchingService, req: ScreenRequest, caller: str) -> ScreenResponse:
    def plan():
        trial_ids, pairs = screen_plan(service, req)
        return pin_trials(service.audit, trial_ids), pairs

    versions, pairs = await asyncio.to_thread(plan)
    rows, failures = [], []
    async for line in match_pairs(service, pairs, versions, req.policy, caller):
        if line.result is not None:
            r = line.result  # ranked alone now, in order below: the full answer is not kept
            links = ScreenLinks(decision=r.links.decision, page=r.links.page)
            row = rank([r.decision])[0].model_dump()
            rows.append(ScreenRow(**row, decision_id=r.decision_id, program_hash=r.program_hash, links=links))
        else:
            failures.append(
                ScreenFailure(
                    trial_id=line.trial_id, patient_id=line.patient_id, status=line.status, error=line.error
                )
            )
    rows = rerank(rows)
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
    shown = rows if req.max_rows is None else rows[: req.max_rows]
    return ScreenResponse(
        direction=req.direction,
        rows=shown,
        rows_omitted=len(rows) - len(shown),
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

    row = service.audit.screening(screening_id)
    if row is None:
        raise NotFound(f"no screening '{screening_id}'")
    out = []
    for decision_id in row.decision_ids:
        d = service.audit.decision(decision_id)
        if d is None:  # the store is append-only: a recorded run's decisions stay
            raise NotFound(f"screening '{screening_id}' names a decision '{decision_id}' that is not stored")
        links = Links.of(decision_id).model_dump()
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
