"""The review loop's logic, apart from HTTP: `ReviewService` (`app.state.reviews`).

    reviews = ReviewService(services)                               # serve/services.py
    await reviews.review(decision_id, ReviewRequest(...), key)    # -> ReviewResponse (a new decision)
    reviews.history(decision_id, cursor, limit)                    # -> DecisionHistory (a page)
    await reviews.revise(trial_id, RevisionRequest(...), key)      # -> RevisionResponse (a new version)
    reviews.flags(trial_id, cursor, limit)                         # -> TrialFlags (a page)

A review makes no language-model call: the stored resolved patient is re-derived with the changes
(`rederive.py`), decided by the core in a worker thread under the service's solver limit, rendered,
and appended as a new decision whose lineage names its parent. One exception: atoms staged mining
left unasked stay open through a review, and when the changes make them able to change the decision
(the core no longer shows it settled), the review completes the mining first (`reading.py`: the
value miner on those atoms, as a match mines them, against the stored chart), in the same new
decision; the lineage records it as a `complete` change and the response its cost. Under
`store_notes: false` the store has no chart: such a review is refused (409 `chart_needed`, naming
POST /v1/decisions/{id}/rereads, which takes the record) and nothing is stored.

A decision already superseded is refused (409 naming the newer one): a reviewer acts on the current
decision, lineages never fork.

What a lineage can hold is bounded (`api.reviews`): superseding decisions per lineage (422 past
it), the text of one review (413) and a flag's note (422); nothing stored is changed by a refusal.
History and flags are read a page at a time, without the decisions' artifacts where they are not
shown. The synchronous methods read the store: the routes run them in a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from verdict.core.decision import ENGINE_VERSION, Decision
from verdict.core.errors import PatientError, PolicyError, VerdictError
from verdict.core.patient import Resolution, ResolvedPatient
from verdict.core.policy import Policy, load_policy
from verdict.core.program import TrialProgram
from verdict.data_gen.formalizer import PairCost, PassageConflict

from ..api_keys import KeyEntry
from ..audit import DecisionRow
from ..audit.artifacts import typed_artifacts
from ..audit.serving import decision_row
from ..audit.store import ACTIVE_ORDER, AuditStore, Guard, Superseded
from ..errors import InvalidInput, NotFound, ServiceError
from ..matching.protocol import Links, MatchResponse, ModelIds
from ..note_free import hidden, note_free
from ..quote_hash import QuoteHasher
from ..rationale import render_rationale
from ..roles import Forbidden
from ..services import Services
from ..trial_versions import TrialVersion
from .protocol import (
    ConfirmChange,
    DecisionHistory,
    FlagChange,
    FlagEntry,
    HistoryEntry,
    Lineage,
    RecordedChange,
    ReviewLinks,
    ReviewRequest,
    ReviewResponse,
    RevisionRequest,
    RevisionResponse,
    TrialFlags,
)
from .reading import COMPLETED_BY_REVIEW, ChartReading, Mined, cost_of, read_changes, rederived
from .rederive import parse_value, previous_of

REVIEW_ROLES = ("review",)
REVISION_ROLES = ("trial_owner",)  # admin holds every role
REVIEWER_SOURCE = "reviewer"  # evidence_source of a corrected value


class ReviewTooLarge(ServiceError):
    """A review's text over `api.reviews.max_review_chars` (413): nothing is stored."""

    status, code = 413, "review_too_large"


def _allowed(key: KeyEntry, roles: tuple[str, ...]) -> None:
    if not any(key.allows(r) for r in roles):
        raise Forbidden(f"this key lacks the role {' or '.join(roles)}")


def stored_patient(row: DecisionRow) -> ResolvedPatient:
    try:
        return ResolvedPatient.model_validate(row.artifacts["patient"])
    except (KeyError, TypeError, ValidationError):
        raise InvalidInput(
            f"decision '{row.decision_id}' has no stored resolved patient to re-derive",
            [("decision_id", "no resolved patient in its artifacts")],
        ) from None


def policy_named(name: str) -> Policy:
    try:
        return load_policy(name)
    except (PolicyError, VerdictError) as e:
        raise InvalidInput(
            f"the decision's policy '{name}' cannot be loaded", [("policy", e.summary)]
        ) from None


def changed_patient(
    program: TrialProgram,
    stored: ResolvedPatient,
    row: DecisionRow,
    policy: Policy,
    mined: list[Mined],
    overrides: dict[str, Resolution | None],
) -> tuple[ResolvedPatient, set[str]]:
    """`reading.rederived`, a change that does not fit the program a 422."""
    try:
        return rederived(program, stored, row, policy, mined, overrides)
    except (PatientError, ValidationError, ValueError) as e:
        raise InvalidInput(
            "the changes do not fit the decision's program", [("changes", str(e)[:300])]
        ) from None


def reviewed(
    parent: DecisionRow,
    stored: DecisionRow,
    result: MatchResponse,
    cls: type[ReviewResponse] = ReviewResponse,
    **extra,
):
    """The answer to a review (or, as `cls` with its `extra` fields, a re-read): the new decision and
    the changes its lineage records."""
    return cls(
        decision_id=stored.decision_id,
        parent_id=parent.decision_id,
        previous_decision=parent.decision,
        changed=stored.decision != parent.decision,
        result=result,
        changes=[RecordedChange.model_validate(c) for c in (stored.lineage or {}).get("changes", [])],
        links=ReviewLinks(
            **Links.of(stored.decision_id).model_dump(), history=f"/v1/decisions/{stored.decision_id}/history"
        ),
        **extra,
    )


def kind_of(row: DecisionRow) -> str:
    return (row.lineage or {}).get("kind", "match") if row.parent_id else "match"


class ReviewService:
    def __init__(self, services: Services):
        self.services = services
        self.reading = ChartReading(services)  # re-derivations that read the chart (reading.py)

    @property
    def audit(self):
        return self.services.audit

    # -- reviews ---------------------------------------------------------------------------------
    async def review(self, decision_id: str, req: ReviewRequest, key: KeyEntry) -> ReviewResponse:
        _allowed(key, REVIEW_ROLES)
        t_start = time.perf_counter()
        self._check_size(req)
        row, program = await asyncio.to_thread(self.reviewable, decision_id)
        policy = policy_named(row.policy_name)
        stored = stored_patient(row)
        now = time.time()
        overrides, changes = self._changes(program, stored, req, key, now)
        stored_row, response = await self._supersede(
            row, program, policy, stored, overrides, changes, key.id, t_start, list(key.roles)
        )
        return reviewed(row, stored_row, response)

    async def annotate(self, decision_id: str, changes: list[RecordedChange], caller: str) -> DecisionRow:
        """A superseding decision that changes no fact: the same patient decided again, its lineage
        recording `changes` that are notes on the decision (an EHR user's feedback on a CDS Hooks card,
        an override as a flag for the reviewers). Refused like a review: a superseded decision (409),
        a full lineage (422)."""
        t_start = time.perf_counter()
        row, program = await asyncio.to_thread(self.reviewable, decision_id)
        policy = policy_named(row.policy_name)
        stored_row, _ = await self._supersede(
            row, program, policy, stored_patient(row), {}, changes, caller, t_start
        )
        return stored_row

    async def _supersede(
        self,
        row: DecisionRow,
        program: TrialProgram,
        policy: Policy,
        stored: ResolvedPatient,
        overrides: dict[str, Resolution | None],
        changes: list[RecordedChange],
        caller: str,
        t_start: float,
        roles: list[str] | None = None,
    ) -> tuple[DecisionRow, MatchResponse]:
        """Re-derive the stored patient with `overrides`, decide, and append as the row's successor
        whose lineage (kind review) records `changes`. Atoms staged mining left unasked because they
        could not change the decision stay open; when the overrides make them able to, their mining
        is completed first (reading.py), in this decision, and the lineage says so."""
        t0 = time.perf_counter()
        patient, conflicts = changed_patient(program, stored, row, policy, [], overrides)
        timings = {"resolve": _ms(t0)}
        mined: list[Mined] = []
        unasked = await self.reading.unsettled(program, patient)
        if unasked:
            why = f"the review lets {len(unasked)} atom(s) not asked change decision '{row.decision_id}'"
            record = self.reading.stored_chart(row, why)
            t0 = time.perf_counter()
            mined = [await self.reading.mine(program, record, unasked, whole=False)]
            timings["value_miner"] = _ms(t0)
            patient, conflicts = changed_patient(program, stored, row, policy, mined, overrides)
            changes = changes + read_changes(
                mined, stored, patient, COMPLETED_BY_REVIEW, caller, roles or [], time.time()
            )
        lineage = Lineage(kind="review", parent_id=row.decision_id, changes=changes)
        successor = Successor(row, program, policy, patient, conflicts, lineage, caller)
        return await self.decide_and_store(successor, timings, t_start, mined)

    def _check_size(self, req: ReviewRequest) -> None:
        """The review's texts within `api.reviews` (413 for the whole, 422 naming a long note)."""
        limits = self.services.config.reviews
        texts = [
            getattr(ch, name) or ""
            for ch in req.changes
            for name in ("reason", "note", "evidence")
            if isinstance(getattr(ch, name, None), str)
        ]
        total = sum(map(len, texts))
        if total > limits.max_review_chars:
            raise ReviewTooLarge(
                f"the review holds {total} characters of text; the limit is {limits.max_review_chars} "
                "(api.reviews.max_review_chars): split it into several reviews",
                [("changes", f"{total} characters of reasons, notes and evidence in all")],
            )
        long_notes = [
            (f"changes.{i}.note", f"{len(ch.note)} characters; the limit is {limits.max_flag_note_chars}")
            for i, ch in enumerate(req.changes)
            if isinstance(ch, FlagChange) and len(ch.note) > limits.max_flag_note_chars
        ]
        if long_notes:
            raise InvalidInput("flag note too long (api.reviews.max_flag_note_chars)", long_notes)

    def reviewable(self, decision_id: str) -> tuple[DecisionRow, TrialProgram]:
        """The decision and its program, if it may be reviewed: current (409 otherwise) and with room
        in its lineage (422 otherwise). Reads the store: call it in a thread."""
        row = decision_row(self.audit, decision_id)
        if self.audit.successor(decision_id) is not None:
            current = self.current_id(decision_id)
            raise Superseded(
                f"decision '{decision_id}' was superseded by '{current}': review the current one",
                [("decision_id", f"superseded by {current}")],
            )
        limit = self.services.config.reviews.max_reviews_per_lineage
        depth = len(self.audit.lineage_ids(decision_id)) - 1
        if depth >= limit:
            raise InvalidInput(
                f"decision '{decision_id}' already has {depth} reviews or re-screenings in its lineage; "
                f"the limit is {limit} (api.reviews.max_reviews_per_lineage): nothing was stored",
                [("decision_id", f"its lineage holds {depth} superseding decisions, the limit")],
            )
        return row, self.services.trials.program_version(row.trial_id, row.program_hash)

    def _changes(
        self, program: TrialProgram, stored: ResolvedPatient, req: ReviewRequest, key: KeyEntry, now: float
    ) -> tuple[dict[str, Resolution | None], list[RecordedChange]]:
        """Every change checked against the program (all problems named at once, by index), as
        overrides of the re-derivation and as the lineage records them."""
        table = program.atom_table()
        criteria = {c.id for _, _, c in program.criteria()}
        have = stored.by_atom()
        keep = self.services.config.store_notes
        problems: list[tuple[str, str]] = []
        overrides: dict[str, Resolution | None] = {}
        seen: dict[str, int] = {}
        recorded: list[RecordedChange] = []
        common = {"reviewer": key.id, "roles": list(key.roles), "at": now}
        for i, ch in enumerate(req.changes):
            where = f"changes.{i}"
            if isinstance(ch, FlagChange):
                if ch.criterion not in criteria:
                    problems.append(
                        (f"{where}.criterion", f"no criterion '{ch.criterion[:80]}' in the program")
                    )
                    continue
                recorded.append(
                    RecordedChange(
                        type="flag", criterion=ch.criterion, note=ch.note, reason=ch.reason, **common
                    )
                )
                continue
            atom = table.get(ch.atom)
            if atom is None:
                problems.append((f"{where}.atom", f"no atom '{ch.atom[:80]}' in the decision's program"))
                continue
            if ch.atom in seen:
                problems.append(
                    (f"{where}.atom", f"atom '{ch.atom}' is already changed by changes.{seen[ch.atom]}")
                )
                continue
            seen[ch.atom] = i
            value = None
            if ch.value is not None:
                value, why = parse_value(atom, ch.value)
                if why:
                    problems.append((f"{where}.value", why))
                    continue
            source = ch.established if isinstance(ch, ConfirmChange) else REVIEWER_SOURCE
            evidence = (
                ch.evidence if keep or not ch.evidence else hidden(ch.evidence, self.services.quote_hasher)
            )
            overrides[ch.atom] = (
                None if value is None
                else Resolution(atom=ch.atom, status="observed", value=value, evidence=evidence or None,
                                evidence_source=source,
                                note=f"{ch.type} by reviewer {key.id}: {ch.reason}"[:500])
            )  # fmt: skip
            recorded.append(RecordedChange(
                type=ch.type, atom=ch.atom, value=value, established=source, evidence=evidence or None,
                previous=previous_of(have.get(ch.atom)), reason=ch.reason, **common,
            ))  # fmt: skip
        if problems:
            raise InvalidInput(
                "invalid review: " + ", ".join(sorted({f for f, _ in problems}))[:300], problems
            )
        return overrides, recorded

    async def decide_and_store(
        self,
        successor: Successor,
        timings: dict[str, float],
        t_start: float,
        mined: list[Mined] | None = None,
    ) -> tuple[DecisionRow, MatchResponse]:
        """Decide (in the solver pool, under the solver limit), render, and append as the parent's
        successor. `mined`: the chart readings this decision made (reading.py), recorded with their
        cost."""
        t0 = time.perf_counter()
        decision = await self.services.engine.adecide(successor.program, successor.patient)
        timings["solve"] = _ms(t0)
        row, response = superseding_decision(
            self.audit,
            successor,
            decision,
            timings,
            t_start,
            mined=mined or [],
            hasher=self.services.quote_hasher,
        )
        stored = await asyncio.to_thread(row)
        metrics = self.services.metrics
        metrics.decisions.labels(decision.decision).inc()
        if mined:
            metrics.observe_pair(cost_of(mined))
        return stored, response(stored)

    # -- history ---------------------------------------------------------------------------------
    def current_id(self, decision_id: str) -> str:
        return self.audit.lineage_head(decision_id)

    def _limit(self, limit: int | None) -> int:
        return limit or self.services.config.reviews.history_page

    def history(
        self, decision_id: str, cursor: str | None = None, limit: int | None = None, latest: bool = False
    ) -> DecisionHistory:
        """One page of the lineage up to `decision_id`, oldest first: from `cursor` (an entry's
        decision id, as `next_cursor` gives it), else from the first entry, or with `latest` the last
        page. Reads the store: call it in a thread."""
        ids = self.audit.lineage_ids(decision_id)
        if not ids:
            raise NotFound(f"no decision '{decision_id}'")
        limit = self._limit(limit)
        if cursor is not None:
            if cursor not in ids:
                raise InvalidInput(
                    "unknown history cursor", [("cursor", "not an entry of this decision's history")]
                )
            start = ids.index(cursor)
        else:
            start = max(0, len(ids) - limit) if latest else 0
        chain = self.audit.decisions(ids[start : start + limit])
        entries = [
            HistoryEntry(
                decision_id=r.decision_id,
                parent_id=r.parent_id,
                kind=kind_of(r),
                created_at=r.created_at,
                created_by=r.created_by,
                program_hash=r.program_hash,
                policy={"name": r.policy_name, "version": r.policy_version},
                decision=r.decision,
                changes=[RecordedChange.model_validate(c) for c in (r.lineage or {}).get("changes", [])],
                trial_version=TrialVersion.recorded(r.artifacts),
            )  # fmt: skip
            for r in chain
        ]
        current = self.current_id(decision_id)
        end = start + limit
        return DecisionHistory(
            decision_id=decision_id, current_id=current, superseded=current != decision_id,
            total=len(ids), offset=start, entries=entries, next_cursor=ids[end] if end < len(ids) else None,
        )  # fmt: skip

    # -- trial revisions and flags ---------------------------------------------------------------
    async def revise(self, trial_id: str, req: RevisionRequest, key: KeyEntry) -> RevisionResponse:
        _allowed(key, REVISION_ROLES)
        active = self.audit.active_trial(trial_id)
        if active is None:
            raise NotFound(f"no trial '{trial_id}': register it with POST /v1/trials")
        revises = req.revises or active.program_hash
        if revises != active.program_hash:
            raise Superseded(
                f"version {revises} of trial '{trial_id}' is not its active version ({active.program_hash})",
                [("revises", f"the active version is {active.program_hash}")],
            )
        # In the solver pool: a hard revision never makes another request's decision wait.
        program = await self.services.trials.checked_program(req.program, key.id, "revision")
        if program.trial_id != trial_id:
            raise InvalidInput(
                "the program is for another trial",
                [("program.trial_id", f"'{program.trial_id}', the route's trial is '{trial_id}'")],
            )
        if program.content_hash == active.program_hash:
            return RevisionResponse(
                trial=self.services.trials.get_trial(trial_id),
                revises=revises,
                reason=req.reason,
                unchanged=True,
            )
        # Refused in the append's transaction if another version became active meanwhile.
        guard = active_version_guard(trial_id, revises)
        row = await asyncio.to_thread(functools.partial(
            self.audit.add_trial, trial_id=trial_id, program_hash=program.content_hash,
            program_json=program.model_dump_json(by_alias=True), origin="revision", created_by=key.id,
            details={"revises": revises, "reason": req.reason, "roles": list(key.roles)}, refuse_if=guard,
        ))  # fmt: skip
        return RevisionResponse(
            trial=self.services.trials.trial_response(row, cached=False), revises=revises, reason=req.reason
        )

    def flags(self, trial_id: str, cursor: str | None = None, limit: int | None = None) -> TrialFlags:
        """One page of the trial's flags, newest first, from `cursor` (as `next_cursor` gives it).
        Reads the store: call it in a thread."""
        if self.audit.active_trial(trial_id) is None:
            raise NotFound(f"no trial '{trial_id}'")
        if cursor is not None and not cursor.isdigit():
            raise InvalidInput("unknown flags cursor", [("cursor", "not a cursor this route gave")])
        limit = self._limit(limit)
        before = int(cursor) if cursor is not None else None
        flags: list[FlagEntry] = []
        while len(flags) < limit:
            rows = self.audit.lineage_changes(trial_id, before, limit)
            for seq, decision_id, program_hash, lineage in rows:
                flags += [
                    FlagEntry(decision_id=decision_id, program_hash=program_hash, criterion=c["criterion"],
                              note=c.get("note") or "", reason=c["reason"], reviewer=c["reviewer"],
                              roles=c["roles"], at=c["at"])
                    for c in (lineage or {}).get("changes", [])
                    if c.get("type") == "flag"
                ]  # fmt: skip
                before = seq
                if len(flags) >= limit:
                    break
            if len(rows) < limit:
                break
        left = before is not None and bool(self.audit.lineage_changes(trial_id, before, 1))
        return TrialFlags(trial_id=trial_id, flags=flags, next_cursor=str(before) if left else None)


@dataclass(frozen=True)
class Successor:
    """What a decision superseding `parent` is made of: the program and policy it is decided under,
    the re-derived patient with the parent's extraction conflicts still open (`conflicts`), and the
    lineage saying why, appended by `caller`."""

    parent: DecisionRow
    program: TrialProgram
    policy: Policy
    patient: ResolvedPatient
    conflicts: set[str]
    lineage: Lineage
    caller: str


def superseding_decision(
    audit: AuditStore,
    successor: Successor,
    decision: Decision,
    timings: dict[str, float],
    t_start: float,
    *,
    mined: list[Mined] | None = None,
    hasher: QuoteHasher | None = None,
) -> tuple[Callable[[], DecisionRow], Callable[[DecisionRow], MatchResponse]]:
    """(a callable that appends the new decision, a function of the stored row -> MatchResponse).
    Shared by reviews, re-reads and `verdict match rescreen`. `mined`: the chart readings this
    decision made (their conflicts, what was read and its cost are recorded; under
    `store_notes: false` their quotes are hashed, `hasher`)."""
    parent, program = successor.parent, successor.program
    policy, patient = successor.policy, successor.patient
    mined = mined or []
    t0 = time.perf_counter()
    passage_conflicts = []
    for c in parent.artifacts.get("extraction_conflicts") or []:
        try:
            pc = PassageConflict.model_validate(c)
        except ValidationError:
            continue
        if pc.atom in successor.conflicts:
            passage_conflicts.append(pc)
    passage_conflicts += [c for m in mined for c in m.conflicts]
    markdown, rationale = render_rationale(program, patient, decision, passage_conflicts)
    version = lineage_version(audit, parent, program)
    cost = cost_of(mined)
    timings["render"] = _ms(t0)
    timings["total"] = _ms(t_start)
    artifacts = typed_artifacts(
        {
            **{
                k: v
                for k, v in parent.artifacts.items()
                # the same record, read the same way: its documents, FHIR sources and chart reading
                if k in ("value_miner", "documents", "fhir", "chart_read", "trial_origin")
            },
            "decision": decision.model_dump(mode="json", by_alias=True),
            "patient": patient.model_dump(mode="json"),
            "extraction_conflicts": [
                c
                for c in parent.artifacts.get("extraction_conflicts") or []
                if not isinstance(c, dict)
                or not (set([c.get("atom")]) | set(c.get("set_aside") or [])).isdisjoint(successor.conflicts)
            ]
            + [c.model_dump(mode="json") for m in mined for c in m.conflicts],  # fmt: skip
            "rationale_markdown": markdown,
            "trial_version": version.model_dump(mode="json"),
            "reread": [m.artifact() for m in mined] or None,
            "cost": cost and cost.model_dump(mode="json"),
        }
    )
    if mined and hasher is not None:  # the new quotes, as the store keeps a match's (already hidden: kept)
        artifacts = note_free(artifacts, mined[0].chart, hasher)
    append = functools.partial(
        audit.add_decision,
        created_by=successor.caller, trial_id=program.trial_id, program_hash=program.content_hash,
        patient_id=parent.patient_id, note_hash=parent.note_hash, patient_hash=patient.content_hash(),
        policy_name=policy.name, policy_version=policy.version, engine_version=ENGINE_VERSION,
        decision=decision.decision, models=parent.models, timings=timings, artifacts=artifacts,
        note_text=parent.note_text, parent_id=parent.decision_id,
        lineage=successor.lineage.model_dump(mode="json"),
    )  # fmt: skip

    def response(stored: DecisionRow) -> MatchResponse:
        models = {k: parent.models.get(k) for k in ModelIds.model_fields}
        models["value_miner"] = models["value_miner"] or "(recorded)"
        models["endpoint"] = models["endpoint"] or ""
        models["prompts"] = models["prompts"] or {}
        return MatchResponse(
            decision_id=stored.decision_id, trial_id=program.trial_id, program_hash=program.content_hash,
            patient_id=parent.patient_id, policy=policy.ref, decision=decision, patient=patient,
            rationale=rationale, rationale_markdown=markdown, extraction_conflicts=passage_conflicts,
            models=ModelIds(**models), timings_ms=timings, cost=cost or PairCost(), trial_cached=True,
            trial_version=version, links=Links.of(stored.decision_id),
        )  # fmt: skip

    return append, response


def lineage_version(audit, parent: DecisionRow, program: TrialProgram) -> TrialVersion:
    """The version a superseding decision is made against: its parent's, now. A preview stays a
    preview while its version is inactive; a version that became inactive under a lineage is pinned."""
    row = audit.trial_version(program.trial_id, program.content_hash)
    before = TrialVersion.recorded(parent.artifacts)
    use = before.use if before is not None and before.use != "active" else "pinned"
    return TrialVersion.of(row, audit.active_trial(program.trial_id), use)


def active_version_guard(trial_id: str, revises: str) -> Guard:
    """Refuses an append when the active version of `trial_id` is no longer `revises`."""
    return Guard(
        "SELECT program_hash FROM (SELECT program_hash FROM trials WHERE trial_id = ? "
        + ACTIVE_ORDER
        + ") AS active WHERE program_hash <> ?",
        (trial_id, revises),
        lambda r: Superseded(
            f"trial '{trial_id}' got another active version meanwhile ({r[0]})",
            [("revises", f"the active version is {r[0]}")],
        ),
    )


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
