"""The CDS Hooks service's logic, apart from HTTP: `CdsHooksService` (`app.state.cds_hooks`).

    hooks = CdsHooksService(services, review_service)
    hooks.discovery()                                   # -> CdsServices
    await hooks.cards(service_id, HookRequest(...), client)     # -> CdsResponse (never waits on a model)
    await hooks.feedback(service_id, FeedbackRequest(...), client)

Cards never hold up the chart. A hook call reads the patient's current decisions from the audit
store (one indexed query) within `cds_hooks.answer_within_s` and answers them as cards, ranked as a
screen ranks (`verdict.core.ranking`); it makes no language-model call. When registered trials have
no current decision for the patient against their active version, the patient is queued for a
screening against those trials (a bounded queue, `cds_hooks.queue_size`; the same trials again only
after `requeue_after_s`) and the call answers what is known, possibly no card. One worker task
runs the queued screenings through the screen path (`serve/screen`): the patient read from the
call's `prefetch`, or from its `fhirServer` with its `fhirAuthorization` token, both at today's
date; the decisions it records are the next call's cards.

Feedback on a card (`accepted` / `overridden`) is recorded in the audit chain as a superseding
decision whose lineage holds it (the review loop's `annotate`: no fact changes); an override with a
reason is also a flag on the decision, listed with the trial's flags for its reviewers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from verdict.core.decision import Decision
from verdict.core.ranking import RankedRow, rank
from verdict.data_gen.fhir.sources import load_source, prefetch_source

from ..api_config import CdsClient
from ..audit import DecisionRow
from ..errors import InvalidInput, NotFound
from ..protocol import PatientInput
from ..reviews.protocol import RecordedChange
from ..reviews.serving import ReviewService
from ..screen.protocol import ScreenRequest, ScreenSource
from ..screen.serving import screen
from ..services import Services
from .client_jwt import ClientJwt
from .protocol import (
    HOOK,
    OVERRIDE_SYSTEM,
    TIER_SYSTEM,
    Card,
    CdsResponse,
    CdsService,
    CdsServices,
    Coding,
    FeedbackItem,
    FeedbackRecorded,
    FeedbackRequest,
    FeedbackResponse,
    HookRequest,
    Link,
    Source,
    card_uuid,
)

log = logging.getLogger("verdict.serve.cds_hooks")
CARD_TIERS = ("eligible", "eligible_to_confirm", "near_miss")  # a card per eligible or near-miss trial
PREFETCH = {
    "patient": "Patient/{{context.patientId}}",
    "documents": "DocumentReference?patient={{context.patientId}}",
    "conditions": "Condition?patient={{context.patientId}}",
    "observations": "Observation?patient={{context.patientId}}",
    "medications": "MedicationRequest?patient={{context.patientId}}",
}
OVERRIDE_REASONS = [
    Coding(code="not-a-candidate", system=OVERRIDE_SYSTEM, display="Not a candidate for this trial"),
    Coding(code="criterion-misread", system=OVERRIDE_SYSTEM, display="A criterion was read wrongly"),
    Coding(code="patient-declined", system=OVERRIDE_SYSTEM, display="The patient declined"),
]


@dataclass(frozen=True)
class Screening:
    """A queued screening: whose, from where (a prefetch, or a FHIR server and its token)."""

    patient_id: str
    trial_ids: list[str]  # the registered trials without a current decision for the patient
    caller: str
    prefetch: dict[str, Any] | None
    fhir_server: str | None
    token: str | None
    token_until: float  # monotonic time the token stops being valid (inf: none given)


def summary(row: RankedRow) -> str:
    """One line under 140 characters: the trial and where the patient stands."""
    k = row.distance
    plural = "s" * (k != 1)
    if row.tier == "eligible":
        state = "eligible, nothing to confirm"
    elif row.tier == "eligible_to_confirm":
        state = f"eligible, {k} condition{plural} to confirm"
    else:
        state = f"near miss: eligible if {k} condition{plural} changed"
    return f"{row.trial_id[: 138 - len(state)]}: {state}"


def detail(row: RankedRow, decided: DecisionRow) -> str:
    lines = [f"**{row.reason}** (rank {row.rank} of this patient's trial matches)."]
    if row.to_confirm:
        lines.append("\nTo confirm at the screening visit: " + ", ".join(f"`{a}`" for a in row.to_confirm))
    if row.would_be_eligible_if:
        lines.append("\nWould be eligible if: " + "; ".join(f"`{c}`" for c in row.would_be_eligible_if))
    when = dt.datetime.fromtimestamp(decided.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines.append(f"\nDecided {when} against trial version `{decided.program_hash[7:19]}`.")
    return "\n".join(lines)


class CdsHooksService:
    def __init__(self, services: Services, reviews: ReviewService):
        self.services, self.reviews = services, reviews
        self.audit, self.egress = services.audit, services.formalizers.egress
        self.cfg = services.config.cds_hooks
        self.public_url = services.config.public_url or ""
        self.jwt = ClientJwt(self.cfg, services.config.public_url, self.egress)
        self.queue: asyncio.Queue[Screening] | None = None  # made in the serving loop, on first use
        self._worker: asyncio.Task | None = None
        # patient id -> {(trial id, program hash): monotonic time the patient was last queued for it}
        self._queued: dict[str, dict[tuple[str, str], float]] = {}
        self.done = 0  # screenings finished (for tests and metrics)

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.clients)

    def check_service(self, service_id: str) -> None:
        if not self.enabled:
            raise NotFound("the CDS Hooks service is off: no EHR is configured (api.cds_hooks.clients)")
        if service_id != self.cfg.service_id:
            raise NotFound(f"no CDS service '{service_id[:100]}': GET /cds-services lists them")

    def discovery(self) -> CdsServices:
        if not self.enabled:
            self.check_service("")
        return CdsServices(
            services=[
                CdsService(
                    hook=HOOK,
                    id=self.cfg.service_id,
                    title=self.cfg.title,
                    description="Clinical trials this patient is eligible for, or nearly eligible for, from "
                    "the site's screening decisions; each card opens the decision's page.",
                    prefetch=PREFETCH,
                )
            ]
        )

    def authenticate(self, authorization: str | None, endpoint_url: str) -> CdsClient:
        return self.jwt.verify(authorization, endpoint_url)

    # -- the hook --------------------------------------------------------------------------------
    async def cards(self, service_id: str, req: HookRequest, client: CdsClient) -> CdsResponse:
        self.check_service(service_id)
        refused = None if req.fhirServer is None else self.egress.refused_host(req.fhirServer)
        if refused is not None:
            raise InvalidInput(
                "fhirServer is not on the site's egress allowlist: nothing was read or queued",
                [("fhirServer", f"host '{refused}' is not allowed (api.egress.allow_hosts)")],
            )
        pid = req.context.patientId
        try:
            cards, missing = await asyncio.wait_for(
                asyncio.to_thread(self._known, pid), timeout=self.cfg.answer_within_s
            )
        except TimeoutError:  # the store is slow: the chart is not held up, and nothing is lost
            log.warning("cds hook: cards not read within %.2f s; answered none", self.cfg.answer_within_s)
            return CdsResponse(cards=[])
        if missing:
            self.queue_screening(req, client, missing)
        return CdsResponse(cards=cards)

    def _known(self, patient_id: str) -> tuple[list[Card], dict[str, str]]:
        """The patient's cards from current decisions against each trial's active version (default
        policy), and the registered trials that lack one (trial id -> its active program hash). Reads
        the store: call it in a thread."""
        audit = self.audit
        policy = self.services.matching.policy(None).name
        newest: dict[str, DecisionRow] = {}
        for row in audit.current_decisions(patient_id=patient_id, policy_name=policy):
            newest[row.trial_id] = row  # oldest first: the newest decision per trial stays
        active = audit.active_versions()
        current = {t: row for t, row in newest.items() if active.get(t) == row.program_hash}
        missing = {t: active[t] for t in sorted(active) if t not in current}
        by_pair = {(r.trial_id, r.patient_id): r for r in current.values()}
        ranked = rank([Decision.model_validate(r.artifacts["decision"]) for r in current.values()])
        shown = [r for r in ranked if r.tier in CARD_TIERS][: self.cfg.max_cards]
        return [self._card(r, by_pair[(r.trial_id, r.patient_id)]) for r in shown], missing

    def _card(self, row: RankedRow, decided: DecisionRow) -> Card:
        page = f"/v1/decisions/{decided.decision_id}/page"
        return Card(
            uuid=card_uuid(decided.decision_id),
            summary=summary(row),
            detail=detail(row, decided),
            indicator="info",
            source=Source(
                label=self.cfg.title,
                topic=Coding(code=row.tier, system=TIER_SYSTEM, display=row.tier.replace("_", " ")),
            ),
            overrideReasons=OVERRIDE_REASONS,
            links=[
                Link(
                    label=f"Open the decision on trial {row.trial_id[:80]}",
                    url=f"{self.public_url}/login?next={quote(page, safe='/')}",
                )
            ],
        )

    # -- the screening queue ---------------------------------------------------------------------
    def queue_screening(self, req: HookRequest, client: CdsClient, missing: dict[str, str]) -> bool:
        """Queue the patient of a hook call for a screening against the `missing` trials (trial id ->
        active program hash) it was not queued for lately: False when each was queued within
        `requeue_after_s` (still being screened, or failed), or the queue is full. A call during a
        screening so never screens its trials twice. Call it in the serving loop (it starts the worker)."""
        pid, now = req.context.patientId, time.monotonic()
        fresh = {v: at for v, at in self._queued.get(pid, {}).items() if now - at < self.cfg.requeue_after_s}
        todo = [t for t, version in missing.items() if (t, version) not in fresh]
        if not todo:
            return False
        if self.queue is None:
            self.queue = asyncio.Queue(maxsize=self.cfg.queue_size)
        auth = req.fhirAuthorization
        job = Screening(
            patient_id=pid,
            trial_ids=todo,
            caller=f"cds:{client.name}",
            prefetch=req.prefetch if req.fhirServer is None else None,
            fhir_server=req.fhirServer,
            token=auth.access_token if auth else None,
            token_until=now + auth.expires_in if auth else float("inf"),
        )
        try:
            self.queue.put_nowait(job)
        except asyncio.QueueFull:
            log.warning("cds hook: the screening queue is full (api.cds_hooks.queue_size); not queued")
            return False
        self._queued[pid] = {**fresh, **{(t, missing[t]): now for t in todo}}
        if len(self._queued) > 10 * self.cfg.queue_size:  # bounded: forget the long-past ones
            self._queued = {
                p: q for p, q in self._queued.items() if now - max(q.values()) < self.cfg.requeue_after_s
            }
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())
        return True

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            try:
                await self._screen(job)
            except Exception as e:  # one patient's failure never stops the queue; no content logged
                log.warning("cds hook: a queued screening failed (%s)", type(e).__name__)
            finally:
                self.done += 1
                self.queue.task_done()

    async def _screen(self, job: Screening) -> None:
        if time.monotonic() >= job.token_until:
            log.warning("cds hook: a queued screening's FHIR token expired before it ran; skipped")
            return
        record = await asyncio.to_thread(self._record, job)
        if record is None or not record.documents:
            log.info("cds hook: the patient has no document to screen; skipped")
            return
        source = (
            ScreenSource(kind="fhir_server", label=job.fhir_server)
            if job.fhir_server
            else ScreenSource(kind="api", label="cds-hooks-prefetch")
        )
        patient = PatientInput(patient_id=job.patient_id, fhir=record)
        req = ScreenRequest(patient=patient, trial_ids=job.trial_ids, source=source)
        await screen(self.services.matching, req, job.caller)

    def _record(self, job: Screening):
        """The patient's FHIR record at today's date, from the call's prefetch or its FHIR server."""
        today = dt.datetime.now(dt.UTC).date()
        if job.fhir_server is not None:
            loaded = load_source(job.fhir_server, today, patient=job.patient_id, bearer=job.token)
        else:
            loaded = prefetch_source(job.prefetch or {}, today, job.patient_id)
        return next((r for r in loaded.records if r.patient_id == job.patient_id), None)

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            # cancelled: how it ends no longer matters
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker

    # -- feedback --------------------------------------------------------------------------------
    async def feedback(self, service_id: str, req: FeedbackRequest, client: CdsClient) -> FeedbackResponse:
        """Each item checked first (an unknown card: 422 naming it, nothing recorded), then recorded
        on the current decision of the card's lineage."""
        self.check_service(service_id)
        heads = await asyncio.to_thread(self._heads, req.feedback)
        recorded = []
        for item, head in zip(req.feedback, heads):
            changes = feedback_changes(item, service_id, f"cds:{client.name}")
            row = await self.reviews.annotate(head, changes, f"cds:{client.name}")
            flagged = any(c.type == "flag" for c in changes)
            recorded.append(FeedbackRecorded(card=item.card, decision_id=row.decision_id, flagged=flagged))
        return FeedbackResponse(recorded=recorded)

    def _heads(self, items: list[FeedbackItem]) -> list[str]:
        audit, problems, heads = self.audit, [], []
        for i, item in enumerate(items):
            if audit.decision(item.decision_id) is None:
                problems.append((f"feedback.{i}.card", "not a card this service gave"))
                continue
            heads.append(audit.lineage_head(item.decision_id))
        if problems:
            raise InvalidInput("unknown card in the feedback: nothing was recorded", problems)
        return heads


def feedback_changes(item: FeedbackItem, service_id: str, caller: str) -> list[RecordedChange]:
    """The lineage changes of one feedback item: the outcome, and for an override with a reason (a
    coded reason or a comment) a flag on the decision as a whole."""
    why = item.overrideReason
    coded = why.reason if why is not None else None
    comment = why.userComment if why is not None else None
    stated = "; ".join(x for x in ((coded.display or coded.code) if coded else None, comment) if x)
    reason = f"{item.outcome} in the EHR" + (f": {stated}" if stated else "")
    common = {"reviewer": caller, "roles": ["cds_client"], "at": time.time()}
    details = {
        "outcome": item.outcome,
        "card": item.card,
        "service": service_id,
        "outcome_timestamp": item.outcomeTimestamp,
        "override_reason": coded.model_dump(exclude_none=True) if coded else None,
    }
    changes = [RecordedChange(type="feedback", reason=reason, details=details, **common)]
    if item.outcome == "overridden" and stated:
        changes.append(RecordedChange(type="flag", note=stated, reason=reason, **common))
    return changes
