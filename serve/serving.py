"""The matching service's logic, apart from HTTP: trials (parse once, cache by content), matches
(value miner -> policy -> core -> rationale -> audit), batches, readiness.

Formalizer calls go through `verdict.data_gen.formalizer.Formalizer` (the one implementation of prompt ->
structured output -> validation -> one repair), pointed at the student adapters. Failure mapping:
down or slow -> FormalizerUnavailable (503 + Retry-After); an output still invalid after the repair,
or an error retrying cannot fix -> FormalizerFailed (502). Nothing is written to the audit store
until a decision is complete, so a failed request leaves nothing half-written.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import time
import traceback
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError
from verdict.core.decision import ENGINE_VERSION, Decision
from verdict.core.errors import PatientError, PolicyError, ProgramError, VerdictError
from verdict.core.patient import ResolvedPatient
from verdict.core.policy import Policy, load_policy, resolve
from verdict.core.program import Id, Provenance, TrialProgram, check_program, load_program
from verdict.core.rationale import md, rationale_json, render_markdown
from verdict.core.settled import settles
from verdict.core.solver_pool import SolverPool
from verdict.data_gen.egress import ENV_ALLOW as EGRESS_ENV
from verdict.data_gen.egress import RULE as EGRESS_RULE
from verdict.data_gen.egress import EgressPolicy
from verdict.data_gen.errors import EgressRefused, EndpointError
from verdict.data_gen.fhir.models import FhirPatientRecord
from verdict.data_gen.fhir.resolve import CodedResolutions, coded_resolutions
from verdict.data_gen.formalizer import Formalizer, core_schema, merge_sides
from verdict.data_gen.formalizer.accounting import PairCost, pair_cost
from verdict.data_gen.formalizer.endpoints import EndpointPool
from verdict.data_gen.formalizer.miner import BUDGET as MINER_BUDGET
from verdict.data_gen.formalizer.miner import MinedValues, PassageConflict
from verdict.data_gen.formalizer.reader import pair_chart_read
from verdict.data_gen.formalizer.staged import held_open, mine_pair
from verdict.data_gen.formalizer.value_reuse import ValueReuse
from verdict.data_gen.protocol import PatientDoc, StageResult, TrialDoc

from .api_config import ApiConfig
from .audit import AuditStore, DecisionRow, TrialRow, open_store
from .audit.artifacts import typed_artifacts
from .errors import (
    FormalizerFailed,
    FormalizerUnavailable,
    InternalError,
    InvalidInput,
    NotFound,
    ServeConfigError,
    ServiceError,
)
from .metrics import ServiceMetrics
from .model_files import ModelFiles
from .note_free import note_free
from .optional_stages import arbiter_markdown, arbitrate, verbalize
from .protocol import (
    DecisionRecord,
    EndpointStatus,
    ErrorBody,
    Links,
    MatchRequest,
    MatchResponse,
    ModelIds,
    Problem,
    Readiness,
    TrialRequest,
    TrialResponse,
    TrialText,
)
from .quote_hash import QuoteHasher, quote_hashing
from .trial_versions import InactiveUse, TrialVersion

log = logging.getLogger("verdict.serve")


def trial_doc(text: TrialText) -> TrialDoc:
    body = text.criteria or f"{text.inclusion or ''}\n{text.exclusion or ''}"
    tid = text.trial_id or "trial-" + hashlib.sha256(body.encode()).hexdigest()[:12]
    return TrialDoc(
        trial_id=tid,
        title=text.title,
        criteria=text.criteria or "",
        inclusion=text.inclusion,
        exclusion=text.exclusion,
        source="api",
    )


def ctgov_doc(study: dict) -> TrialDoc:
    """One ClinicalTrials.gov study record, read by the project's one CT.gov reader."""
    from verdict.data_gen.sources import ctgov_studies

    problems: list[str] = []
    try:
        items = list(ctgov_studies(study, "study", problems))
    except VerdictError as e:
        raise InvalidInput("unreadable ClinicalTrials.gov study", [("ctgov_study", e.summary)]) from None
    if problems or len(items) != 1:
        raise InvalidInput(
            "unreadable ClinicalTrials.gov study",
            [("ctgov_study", m) for m in problems or ["expected exactly one study"]],
        )
    try:  # the NCT id becomes the trial id: refused here, not by the parser's output check (a 502)
        TypeAdapter(Id).validate_python(items[0].trial_id)
    except ValidationError:
        raise InvalidInput(
            "unreadable ClinicalTrials.gov study",
            [("ctgov_study", "the study's nctId is not a valid trial id (letters, digits, _.:/@-)")],
        ) from None
    return items[0]


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True)
class _Decided:
    """What `MatchingService._decide` derived from the mined values: the answer and its audit artifacts."""

    inc: StageResult
    exc: StageResult
    mined: MinedValues  # both sides merged (merge_sides): values, conflicts, sources
    patient: ResolvedPatient
    decision: Decision
    arbiter: dict | None
    markdown: str
    rationale: dict
    rationale_text: str | None
    verbalizer: dict | None


class MatchingService:
    def __init__(
        self,
        config: ApiConfig,
        base_url: str | list[str],
        *,
        audit: AuditStore | None = None,
        metrics: ServiceMetrics | None = None,
    ):
        self.config = config
        self.model_files = ModelFiles(config.formalizer.model_files)  # hashed in the background
        self.base_urls = [u.rstrip("/") for u in ([base_url] if isinstance(base_url, str) else base_url)]
        self.base_url = self.base_urls[0]  # names the endpoint in cache keys: the first of the pool
        fc = config.formalizer
        self.egress = EgressPolicy.from_config(config.egress)
        self._check_allowlist()
        parser_ep = fc.endpoint(fc.parser_model, self.base_url)
        miner_ep = fc.endpoint(fc.value_miner_model, self.base_url)
        # One pool for both adapters: per server, one bound on requests in flight towards it.
        self.client = EndpointPool(
            parser_ep,
            self.base_urls,
            required_models=[fc.parser_model, fc.value_miner_model],
            egress=self.egress,
            check_interval_s=fc.health_check_interval_s,
            check_timeout_s=fc.health_check_timeout_s,
        )
        # Every decision and satisfiability check, the parser's and the arbiter's too, runs in the
        # pool's worker processes (verdict.core.solver_pool) under solver_timeout_ms: a hard program
        # never makes a short decision wait, and no solver work runs on the event loop.
        self.engine: SolverPool = config.solver_pool.pool(config.solver_timeout_ms, config.alternatives)
        # Under store_notes false: the store's secret for hashing the text it does not keep.
        self.quote_hasher = None if config.store_notes else QuoteHasher.from_file(config.audit_hash_key_path)
        self.parser = Formalizer(
            parser_ep,
            engine=self.engine,
            egress=self.egress,
            prompts=fc.prompts,
            run="serve",
            client=self.client,
        )
        self.miner = Formalizer(
            miner_ep,
            engine=self.engine,
            egress=self.egress,
            prompts=fc.prompts,
            run="serve",
            client=self.client,
            value_reuse=ValueReuse() if fc.reuse_values else None,
            reading=fc.reading,
        )
        self.audit = audit or open_store(config)
        self.metrics = metrics or ServiceMetrics()
        self.metrics.watch_solver_pool(self.engine)
        self._parse_locks: dict[str, asyncio.Lock] = {}
        self._programs: OrderedDict[str, TrialProgram] = OrderedDict()
        self._base_model: str | None = None
        # Servers whose structured-output grammars are warm (warm_grammars); readiness waits for one.
        self._warm: set[str] = set()
        self._warm_lock = asyncio.Lock()
        self._warm_task: asyncio.Task | None = None
        self._warm_problem: str | None = None

    def _check_allowlist(self) -> None:
        """Refuse to start if patient text could go to a host the site has not allowed (any endpoint
        of the pool may get any request)."""
        for url in self.base_urls:
            self._check_host(urlsplit(url).hostname or "")

    def _check_host(self, host: str) -> None:
        if not self.egress.host_allowed(host):
            raise ServeConfigError(
                f"refusing to start: the formalizer host '{host}' is not on the site allowlist for patient "
                f"text (rule: {EGRESS_RULE}); add it to api.egress.allow_hosts in the serve config or to "
                f"${EGRESS_ENV}"
            )

    def warm_up(self) -> None:
        """Pay the first request's one-time costs at start (client library import, output schemas,
        the solver pool's fork server)."""
        import openai  # noqa: F401

        self.engine.start()
        core_schema("parsed-criterion")
        core_schema("value-miner")
        if self.config.formalizer.warm_up_grammars:
            try:
                self._warm_task = asyncio.get_running_loop().create_task(self._warm_at_start())
            except RuntimeError:  # no loop yet: the first readiness check warms up
                pass

    async def _warm_at_start(self) -> None:
        await self.client.check_all()
        await self.warm_grammars()

    def _warm_requests(self) -> list[tuple[Formalizer, str, dict, str]]:
        """One request per stage schema: the per-criterion parser's and the value miner's."""
        from verdict.data_gen.formalizer.checks import with_atom_enum

        return [
            (self.parser, "parser", core_schema("parsed-criterion"), "parsed_criterion"),
            (
                self.miner,
                "miner_inclusion",
                with_atom_enum(core_schema("value-miner"), ["warm_up"]),
                "value_miner",
            ),
        ]

    async def warm_grammars(self) -> str | None:
        """Send every up server not yet warm one constrained request per stage schema (no patient
        text, 1 new token), so the first real request does not pay the grammar backend's one-time
        setup. Returns None when every up server is warm, else why not (retried on the next call)."""
        from verdict.data_gen.client import build_request
        from verdict.data_gen.formalizer.endpoints import failure_reason

        async with self._warm_lock:
            problems = []
            for m in self.client.members:
                if m.state != "up" or m.base_url in self._warm:
                    continue
                try:
                    for fz, stage, schema, name in self._warm_requests():
                        msgs = [
                            {"role": "system", "content": "Return JSON."},
                            {"role": "user", "content": "{}"},
                        ]
                        req = build_request(fz.endpoint, stage, msgs, schema, name)
                        req[fz.endpoint.max_tokens_param] = 1
                        await m.client.complete(
                            req,
                            carries_patient_text=False,
                            data_class="public",
                            what=f"{stage} grammar warm-up",
                        )
                except EndpointError as e:
                    problems.append(f"{origin_of(m.base_url)}: {failure_reason(e)}")
                    log.warning(
                        "grammar warm-up of %s failed (%s); retried at the next readiness check",
                        m.base_url,
                        failure_reason(e),
                    )
                    continue
                self._warm.add(m.base_url)
            self._warm_problem = "; ".join(problems) or None
            return self._warm_problem

    async def aclose(self) -> None:
        if self._warm_task is not None:
            self._warm_task.cancel()
            try:
                await self._warm_task
            except (asyncio.CancelledError, Exception):
                pass
        await self.client.aclose()
        await asyncio.to_thread(self.engine.close)

    # -- policies and programs -------------------------------------------------------------------
    def policy(self, name: str | None) -> Policy:
        try:
            return load_policy(name or self.config.default_policy)
        except PolicyError as e:
            raise InvalidInput("unknown policy", [("policy", e.summary)]) from None
        except VerdictError as e:
            raise InvalidInput("unknown policy", [("policy", str(e))]) from None

    def program_of(self, row: TrialRow) -> TrialProgram:
        program = self._programs.get(row.program_hash)
        if program is None:
            program = load_program(row.program_json)
            self._programs[row.program_hash] = program
            while len(self._programs) > 256:
                self._programs.popitem(last=False)
        return program

    # -- trials ----------------------------------------------------------------------------------
    async def register_trial(self, req: TrialRequest, caller: str) -> TrialResponse:
        if req.program is not None:
            row = await self.upload_program(req.program, caller)
            return self._trial_response(row, cached=False)
        doc = trial_doc(req.text) if req.text is not None else ctgov_doc(req.ctgov_study)
        row, cached = await self.parsed_trial(doc, caller)
        return self._trial_response(row, cached)

    async def upload_program(self, data: dict, caller: str) -> TrialRow:
        """A reviewed program (admin role): checked like parser output, then the active version of its
        trial id (verdict.serve.audit.store: which version a match uses)."""
        program = await self.checked_program(data, caller)
        existing = self.audit.active_trial(program.trial_id)
        if existing is not None and existing.program_hash == program.content_hash and existing.reviewed:
            return existing
        return await asyncio.to_thread(
            functools.partial(
                self.audit.add_trial,
                trial_id=program.trial_id,
                program_hash=program.content_hash,
                program_json=program.model_dump_json(by_alias=True),
                origin="upload",
                created_by=caller,
            )
        )

    async def checked_program(self, data: dict, caller: str, source: str = "upload") -> TrialProgram:
        """A program from a person (an upload, a revision): validated, statically checked and
        satisfiable within the solver limit (in the solver pool), else InvalidInput naming
        `program.<path>`."""
        try:
            program = TrialProgram.model_validate(data)
        except ValidationError as e:
            raise InvalidInput(
                "invalid trial program",
                [
                    (".".join(["program", *(str(p) for p in err["loc"])]), err["msg"])
                    for err in e.errors(include_url=False, include_input=False)
                ][:50],
            ) from None
        try:
            program = check_program(program.model_copy(update={"content_hash": None}))
            await self.engine.acheck_satisfiable(program)
        except ProgramError as e:
            raise InvalidInput(
                e.summary, [("program", p) for p in e.problems] or [("program", e.summary)]
            ) from None
        return program.model_copy(
            update={"provenance": program.provenance or Provenance(source=source, details={"key": caller})}
        )

    async def parsed_trial(self, doc: TrialDoc, caller: str) -> tuple[TrialRow, bool]:
        """The program for this criteria text: from the parse cache, or parsed once (concurrent
        requests for the same text wait for the one parse)."""
        key = self.parser.parser_key(doc)  # criteria as split + parser model + prompt version
        row = self.audit.trial_by_source(key)
        if row is None:
            lock = self._parse_locks.setdefault(key, asyncio.Lock())
            async with lock:
                row = self.audit.trial_by_source(key)
                if row is None:
                    self.metrics.trial_cache.labels("miss").inc()
                    res = await self._stage(self.parser.parse_trial(doc), "parse")
                    program: TrialProgram = res.output
                    row = self.audit.add_trial(
                        trial_id=program.trial_id,
                        program_hash=program.content_hash,
                        program_json=program.model_dump_json(by_alias=True),
                        origin="parser",
                        created_by=caller,
                        source_key=key,
                        parser_model=self.parser.endpoint.model,
                        prompt_version=res.prompt_version,
                    )
                    self._parse_locks.pop(key, None)
                    return row, False
            self._parse_locks.pop(key, None)
        self.metrics.trial_cache.labels("hit").inc()
        return row, True

    def get_trial(self, trial_id: str, program_hash: str | None = None) -> TrialResponse:
        return self._trial_response(self._trial_row(trial_id, program_hash), cached=True)

    def _trial_row(
        self, trial_id: str, program_hash: str | None, problems: list[tuple[str, str]] | None = None
    ) -> TrialRow:
        """The version `program_hash` of a trial, else its active version; NotFound if none."""
        row = (
            self.audit.trial_version(trial_id, program_hash)
            if program_hash
            else self.audit.active_trial(trial_id)
        )
        if row is None:
            what = f"trial '{trial_id}'" + (f" version {program_hash}" if program_hash else "")
            raise NotFound(f"no {what}: register it with POST /v1/trials", problems)
        return row

    def _trial_response(self, row: TrialRow, cached: bool) -> TrialResponse:
        active = self.audit.active_trial(row.trial_id)
        active_hash = active.program_hash if active is not None else row.program_hash
        return TrialResponse(
            trial_id=row.trial_id,
            program_hash=row.program_hash,
            origin=row.origin,
            active=active_hash == row.program_hash,
            active_program_hash=active_hash,
            cached=cached,
            parser_model=row.parser_model,
            prompt_version=row.prompt_version,
            created_at=row.created_at,
            program=self.program_of(row),
        )

    # -- matching --------------------------------------------------------------------------------
    async def match(
        self, req: MatchRequest, caller: str, inactive_use: InactiveUse = "refuse"
    ) -> MatchResponse:
        """trial -> value miner (both sides) -> policy -> core -> rationale -> audit row.
        `inactive_use`: what a `program_hash` pinning an inactive version gets (serve/trial_versions.py)."""
        t_start = time.perf_counter()
        timings: dict[str, float] = {}
        policy = self.policy(req.policy)
        row, cached = await self._trial_for(req, caller, timings)
        active = await asyncio.to_thread(self.audit.active_trial, row.trial_id)
        version = TrialVersion.of(row, active, inactive_use if req.trial is None else "inline")
        program = self.program_of(row)
        record = PatientDoc(patient_id=req.patient.patient_id, documents=req.patient.documents())
        # A FHIR record's coded facts decide some atoms (verdict.data_gen.fhir.resolve), unasked of the miner.
        coded = coded_resolutions(program, req.patient.fhir) if req.patient.fhir is not None else None
        self.metrics.in_flight.inc()
        try:
            inc, exc = await self._mine(program, record, coded, policy, timings)
            d = await self._decide(program, record, policy, inc, exc, coded, timings)
            models = await self._models(row)
            cost = pair_cost(inc, exc)
            timings["total"] = _ms(t_start)
            stored = await self._record(
                req, caller, row, program, policy, record, coded, d, models, timings, cost, version
            )
        finally:
            self.metrics.in_flight.dec()
        self.metrics.decisions.labels(d.decision.decision).inc()
        self.metrics.observe_pair(cost)
        return MatchResponse(
            decision_id=stored.decision_id,
            trial_id=program.trial_id,
            program_hash=program.content_hash,
            patient_id=record.patient_id,
            policy=policy.ref,
            decision=d.decision,
            patient=d.patient,
            rationale=d.rationale,
            rationale_markdown=d.markdown,
            rationale_text=d.rationale_text,
            extraction_conflicts=d.mined.conflicts,
            models=models,
            timings_ms=timings,
            cost=cost,
            trial_cached=cached,
            trial_version=version,
            links=Links(
                decision=f"/v1/decisions/{stored.decision_id}",
                page=f"/v1/decisions/{stored.decision_id}/page",
            ),
        )

    async def _trial_for(
        self, req: MatchRequest, caller: str, timings: dict[str, float]
    ) -> tuple[TrialRow, bool]:
        """The trial version a match uses, and whether it was cached: inline text is parsed once (a
        reviewed program of its trial id wins), a trial id is looked up as `get_trial` does."""
        if req.trial is None:
            return self._trial_row(req.trial_id, req.program_hash, [("trial_id", "unknown trial")]), True
        doc = trial_doc(req.trial)
        active = self.audit.active_trial(doc.trial_id)
        if active is not None and active.reviewed:  # inline text never overrides a reviewed program
            return active, True
        t0 = time.perf_counter()
        row, cached = await self.parsed_trial(doc, caller)
        timings["parse"] = _ms(t0)
        return row, cached

    async def _mine(
        self,
        program: TrialProgram,
        record: PatientDoc,
        coded: CodedResolutions | None,
        policy: Policy,
        timings: dict[str, float],
    ) -> tuple[StageResult, StageResult]:
        """The value miner's inclusion and exclusion passes (atoms `coded` decides skipped): staged
        (`api.formalizer.staged_mining`, data_gen/formalizer/staged.py: the exclusion side first, the
        inclusion side only when it can change the decision), else both concurrently."""
        note = record.text  # every document's text: what error messages must never quote
        skip = coded.decided if coded is not None else frozenset()
        t0 = time.perf_counter()

        def side(s: str):
            return self._stage(self.miner.mine_values(program, record, s, skip=skip), f"miner_{s}", note)

        if self.config.formalizer.staged_mining:
            pair = await mine_pair(
                self.miner,
                self.engine,
                program,
                record,
                policy,
                skip=skip,
                mine=side,
                # the stop rule sees what the decision will: the coded FHIR facts too
                settle=lambda p, unasked: settles(
                    program, coded.apply(p) if coded is not None else p, unasked, self.engine
                ),
            )
            inc, exc = pair.inc, pair.exc
        else:
            inc, exc = await _both(side("inclusion"), side("exclusion"))
        timings["value_miner"] = _ms(t0)
        return inc, exc

    async def _decide(
        self,
        program: TrialProgram,
        record: PatientDoc,
        policy: Policy,
        inc: StageResult,
        exc: StageResult,
        coded: CodedResolutions | None,
        timings: dict[str, float],
    ) -> _Decided:
        """Mined values -> resolved patient (policy, coded facts) -> the core's decision (the opt-in
        arbiter may decide again) -> rationale (and the opt-in verbalizer's prose)."""
        t0 = time.perf_counter()
        mined = merge_sides(inc.output, exc.output)  # passages, documents and sides: one merge rule
        try:
            patient = resolve(
                program,
                record.patient_id,
                list(mined),
                policy,
                held_open=held_open(inc, exc),  # conflicts, unread and unasked atoms
                sources=mined.sources,
            )
        except PatientError as e:  # the formalizer checks types; this is a second line of defence
            raise FormalizerFailed(  # the problems can quote values from the note: counted only
                "value-miner output does not fit the trial program",
                [
                    (
                        "value_miner",
                        f"{len(e.problems)} problem(s) (details withheld: they may quote the note)",
                    )
                ],
            ) from None
        if coded is not None:
            patient = coded.apply(patient)
        timings["resolve"] = self._observe("resolve", t0)
        t0 = time.perf_counter()
        decision = await self.engine.adecide(program, patient)
        timings["solve"] = self._observe("solve", t0)
        # Opt-in (api.formalizer.arbiter): facts contradicting definitions re-read, decided again.
        decision, arbiter = await arbitrate(self, program, record, patient, decision, timings)
        t0 = time.perf_counter()
        markdown = (
            render_markdown(program, patient, decision)
            + conflicts_markdown(mined.conflicts)
            + arbiter_markdown(arbiter)
        )
        rationale = rationale_json(program, patient, decision)
        rationale["extraction_conflicts"] = [c.model_dump(mode="json") for c in mined.conflicts]
        timings["render"] = self._observe("render", t0)
        # Opt-in (api.formalizer.verbalizer): prose restating the decision; decides nothing.
        rationale_text, verbalizer = await verbalize(self, program, record, patient, decision, timings)
        rationale.update(
            {k: v for k, v in (("arbiter", arbiter), ("verbalizer", verbalizer)) if v is not None}
        )
        return _Decided(
            inc, exc, mined, patient, decision, arbiter, markdown, rationale, rationale_text, verbalizer
        )

    async def _models(self, row: TrialRow) -> ModelIds:
        return ModelIds(
            parser=row.parser_model,
            value_miner=self.miner.endpoint.model,
            base_model=await self.base_model(),
            endpoint=", ".join(origin_of(u) for u in self.base_urls),
            prompts={s: self.miner.prompt(s).ident for s in ("parser", "miner_inclusion", "miner_exclusion")},
            files=await asyncio.to_thread(self.model_files.pins),
        )

    async def _record(
        self,
        req: MatchRequest,
        caller: str,
        row: TrialRow,
        program: TrialProgram,
        policy: Policy,
        record: PatientDoc,
        coded: CodedResolutions | None,
        d: _Decided,
        models: ModelIds,
        timings: dict[str, float],
        cost: PairCost,
        version: TrialVersion,
    ) -> DecisionRow:
        """The decision's audit row: what an auditor needs to reproduce it (observed as stage 'audit')."""
        stored_note = stored_record(req.patient.note, record)
        chart_read = pair_chart_read(d.inc, d.exc, d.mined.sources)  # None: the chart was mined whole
        t0 = time.perf_counter()
        # In a thread: a PostgreSQL store waits for the chain lock and the network; the loop must not.
        stored = await asyncio.to_thread(
            functools.partial(
                self.audit.add_decision,
                created_by=caller,
                trial_id=program.trial_id,
                program_hash=program.content_hash,
                patient_id=record.patient_id,
                note_hash=_sha256(stored_note),
                patient_hash=d.patient.content_hash(),
                policy_name=policy.name,
                policy_version=policy.version,
                engine_version=ENGINE_VERSION,
                decision=d.decision.decision,
                models=models.model_dump(),
                timings=timings,
                artifacts=self._kept(
                    record.text,
                    typed_artifacts(
                        {
                            "decision": d.decision.model_dump(mode="json", by_alias=True),
                            "patient": d.patient.model_dump(mode="json"),
                            "value_miner": {
                                r.stage: {
                                    "output": json.loads(r.output_json or "null"),
                                    "attempts": len(r.attempts),
                                    "prompt": r.prompt_version,
                                    "calls": [{"item": c.item, "attempts": len(c.attempts)} for c in r.calls],
                                    "sources": r.output.sources,
                                    "not_asked": (r.assembly or {}).get("not_asked", []),
                                }
                                for r in (d.inc, d.exc)
                            },
                            "documents": documents_meta(req.patient.note, record),
                            "fhir": fhir_meta(req.patient.fhir, coded),
                            "extraction_conflicts": [c.model_dump(mode="json") for c in d.mined.conflicts],
                            "chart_read": chart_read and chart_read.model_dump(mode="json"),
                            "rationale_markdown": d.markdown,
                            "arbiter": d.arbiter,
                            "verbalizer": d.verbalizer
                            and {**d.verbalizer, "rationale_text": d.rationale_text},
                            "trial_origin": row.origin,
                            "cost": cost.model_dump(mode="json"),
                            "trial_version": version.model_dump(mode="json"),
                        }
                    ),
                ),
                note_text=stored_note,
            )
        )
        self._observe("audit", t0)
        return stored

    # -- audit -----------------------------------------------------------------------------------
    def decision_row(self, decision_id: str) -> DecisionRow:
        row = self.audit.decision(decision_id)
        if row is None:
            raise NotFound(f"no decision '{decision_id}'")
        return row

    def decision_record(self, decision_id: str) -> DecisionRecord:
        r = self.decision_row(decision_id)
        return DecisionRecord(
            decision_id=r.decision_id,
            created_at=r.created_at,
            created_by=r.created_by,
            trial_id=r.trial_id,
            program_hash=r.program_hash,
            patient_id=r.patient_id,
            note_sha256=r.note_hash,
            patient_hash=r.patient_hash,
            policy={"name": r.policy_name, "version": r.policy_version},
            engine_version=r.engine_version,
            decision=r.decision,
            models=r.models,
            timings_ms=r.timings,
            artifacts=r.artifacts,
            note_stored=r.note_text is not None,
            trial_version=TrialVersion.recorded(r.artifacts),
            quote_hashing=quote_hashing(r.artifacts),
            parent_id=r.parent_id,
            lineage=r.lineage,
        )

    def program_version(self, trial_id: str, program_hash: str) -> TrialProgram:
        row = self.audit.trial_version(trial_id, program_hash)
        if row is None:
            raise NotFound(f"no trial '{trial_id}' version {program_hash}")
        return self.program_of(row)

    # -- readiness -------------------------------------------------------------------------------
    async def readiness(self) -> Readiness:
        """Ready when at least one endpoint lists both adapters; each endpoint's state is listed."""
        from .vllm_server import exit_note

        wanted = [self.parser.endpoint.model, self.miner.endpoint.model]
        members = await self.client.check_all()
        states = []
        for m in members:
            # A vLLM this process started and saw die says how it ended (e.g. killed by SIGKILL).
            reason = (exit_note(m.base_url) or m.reason) if m.state == "down" else m.reason
            states.append(
                EndpointStatus(
                    endpoint=origin_of(m.base_url),
                    state=m.state,
                    reason=reason,
                    models=m.models,
                    in_flight=m.in_flight,
                    failures=m.failures,
                )
            )
            if m.state == "up" and self._base_model is None:
                self._base_model = m.parents.get(wanted[0]) or m.parents.get(wanted[1])
        up = [m for m in members if m.state == "up"]
        listed = sorted({x for m in (up or members) for x in m.models}, key=lambda x: x)
        missing = [] if up else [w for w in wanted if w not in listed]
        reason = None
        if not up:
            reason = "; ".join(f"{st.endpoint}: {st.reason}" for st in states)
            reason = ("formalizer " if len(states) == 1 else "no formalizer endpoint is ready: ") + reason
        elif self.config.formalizer.warm_up_grammars:
            # Ready only once a server's grammars are warm; a check during the warm-up does not wait.
            if not any(m.base_url in self._warm for m in up) and not self._warm_lock.locked():
                await self.warm_grammars()
            up = [m for m in up if m.base_url in self._warm]
            if not up:
                reason = "warming up the structured-output grammars" + (
                    f" (last attempt: {self._warm_problem})" if self._warm_problem else ""
                )
        return Readiness(
            ready=bool(up),
            formalizer=", ".join(origin_of(u) for u in self.base_urls),
            models=listed,
            missing=missing,
            reason=reason,
            endpoints=states,
        )

    async def base_model(self) -> str | None:
        """The adapters' base model as a server lists it. Asks only servers not marked down and never
        checked: a down one is re-checked by the pool's own schedule, never brought back by a match,
        and a checked one that lists no parent (no adapters) is not asked again at every match."""
        wanted = (self.parser.endpoint.model, self.miner.endpoint.model)
        for m in self.client.members:
            if self._base_model is not None:
                break
            if m.usable and not m.parents and m.checked_at is None:
                await self.client.check(m)
            self._base_model = next((m.parents[w] for w in wanted if w in m.parents), None)
        return self._base_model

    # -- one formalizer stage, with failure mapping and metrics ----------------------------------
    async def _stage(self, call, stage: str, note: str | None = None) -> StageResult:
        t0 = time.perf_counter()
        try:
            res: StageResult = await call
        except EndpointError as e:
            # A fixed message: stage, status, reference. Upstream text (servers echo prompts) never
            # passes through, whatever its length.
            ref, what = uuid.uuid4().hex[:12], endpoint_failure(e, self.config.formalizer.timeout_s)
            log.warning(
                "stage=%s formalizer error ref=%s status=%s retryable=%s: %s",
                stage,
                ref,
                e.status,
                e.retryable,
                what,
            )
            if e.retryable:
                raise FormalizerUnavailable(
                    f"the formalizer ({stage}) is unavailable: {what} (reference {ref})",
                    headers={"Retry-After": str(self.config.retry_after_s)},
                ) from None
            raise FormalizerFailed(f"the formalizer ({stage}) failed: {what} (reference {ref})") from None
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
            ref = uuid.uuid4().hex[:12]
            log.warning("stage=%s rejected after repair reason=%s ref=%s", stage, res.reason, ref)
            # The checks' messages can carry model output, which can quote the note: for a stage that
            # read a note only their count and reason go out.
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
            problems += [
                (stage, f"call {c.item} rejected (reason: {c.reason})") for c in res.calls if not c.accepted
            ][:20]
            raise FormalizerFailed(
                f"the {stage} output failed validation after one repair attempt (reason: {res.reason})",
                problems,
            )
        return res

    def _kept(self, note: str, artifacts: dict) -> dict:
        """The artifacts as the audit store keeps them: under store_notes false, no note text."""
        return artifacts if self.quote_hasher is None else note_free(artifacts, note, self.quote_hasher)

    def _observe(self, stage: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.metrics.observe_stage(stage, dt)
        return round(dt * 1000, 3)


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


def internal_error(e: BaseException) -> ServiceError:
    """An unexpected failure as a 500 naming an incident id; logged as its type and place only
    (exception messages can carry request content)."""
    incident = uuid.uuid4().hex[:12]
    frames = traceback.extract_tb(e.__traceback__)[-6:]
    where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}" for f in reversed(frames))
    log.error("internal error incident=%s type=%s at %s", incident, type(e).__name__, where)
    return InternalError(f"internal error (incident {incident}); see the service log")


def error_body(e: ServiceError) -> ErrorBody:
    return ErrorBody(
        error=e.code, message=e.summary, problems=[Problem(field=f, message=m) for f, m in e.field_problems]
    )


async def _both(a, b):
    """Run two coroutines; if one fails, cancel the other and raise the first failure itself."""
    ta, tb = asyncio.ensure_future(a), asyncio.ensure_future(b)
    try:
        return await asyncio.gather(ta, tb)
    except BaseException:
        for t in (ta, tb):
            t.cancel()
        await asyncio.gather(ta, tb, return_exceptions=True)
        raise


def stored_record(note: str | None, record: PatientDoc) -> str:
    """The patient text as the audit store keeps it: a single `note` as is; several documents as the
    JSON list [{"id", "text"}] (the decision's `documents` artifact says which)."""
    if note is not None:
        return note
    docs = [{"id": d.id, "text": d.text} for d in record.note_documents()]
    return json.dumps(docs, ensure_ascii=False, separators=(",", ":"))


def documents_meta(note: str | None, record: PatientDoc) -> list[dict] | None:
    """The documents of a `notes` request (ids, dates, kinds, hashes; no text); None for a `note`."""
    if note is not None:
        return None
    return [
        {"id": d.id, "date": d.date, "kind": d.kind, "sha256": _sha256(d.text)}
        for d in record.note_documents()
    ]


def fhir_meta(rec: FhirPatientRecord | None, coded: CodedResolutions | None) -> dict | None:
    """Where a FHIR patient's values came from (resource ids, no text): the reference date, the atoms
    coded facts decided and why the others were left to the miner, the record's problems."""
    if rec is None or coded is None:
        return None
    return {
        "patient": f"Patient/{rec.patient_id}",
        "reference_date": rec.reference_date,
        "coded_atoms": {r.atom: r.evidence_source for r in coded.resolutions},
        "left_for_miner": coded.notes,
        "refused": coded.refused,
        "problems": rec.problems,
    }


def conflicts_markdown(conflicts: list[PassageConflict]) -> str:
    """The rationale's section on values the documents disagree on (the atoms were left open)."""
    if not conflicts:
        return ""
    out = ["", "", "### Documents disagree (left open, confirm in the chart)"]
    for c in conflicts:
        said = "; ".join(
            f'document `{f.document}`: {f.shown(c.atom)} ("{md(f.evidence)}")' for f in c.findings
        )
        out.append(f"- {c.atom}: {said}")
    return "\n".join(out)


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
