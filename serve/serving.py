"""The matching service's logic, apart from HTTP: trials (parse once, cache by content), matches
(value miner -> policy -> core -> rationale -> audit), batches, readiness.

Formalizer calls go through `data_gen.formalizer.Formalizer` (the one implementation of prompt ->
structured output -> validation -> one repair), pointed at the student adapters. Failure mapping:
down or slow -> FormalizerUnavailable (503 + Retry-After); an output still invalid after the repair,
or an error retrying cannot fix -> FormalizerFailed (502). Nothing is written to the audit store
until a decision is complete, so a failed request leaves nothing half-written.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import AsyncIterator
from urllib.parse import urlsplit

from pydantic import ValidationError

from data_gen.client import EndpointClient, quotes_any
from data_gen.egress import ENV_ALLOW as EGRESS_ENV
from data_gen.egress import RULE as EGRESS_RULE
from data_gen.egress import EgressPolicy
from data_gen.errors import EgressRefused, EndpointError
from data_gen.formalizer import Formalizer, core_schema
from data_gen.protocol import StageResult, TrialDoc
from verdict_core.decision import ENGINE_VERSION
from verdict_core.engine import Engine
from verdict_core.errors import PatientError, PolicyError, ProgramError, VerdictError
from verdict_core.policy import Policy, load_policy, resolve
from verdict_core.program import Provenance, TrialProgram, check_program, load_program
from verdict_core.rationale import rationale_json, render_markdown

from .api_config import ApiConfig
from .audit import AuditStore, DecisionRow, TrialRow
from .errors import (
    FormalizerFailed,
    FormalizerUnavailable,
    InvalidInput,
    NotFound,
    ServeConfigError,
    ServiceError,
)
from .metrics import ServiceMetrics
from .protocol import (
    BatchLine,
    BatchRequest,
    DecisionRecord,
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

log = logging.getLogger("serve")
PROBLEM_WITHHELD = "[withheld: the message quotes the note]"


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
    from data_gen.sources import load_trials

    with tempfile.TemporaryDirectory(prefix="ctgov-") as d:
        path = Path(d) / "study.json"
        path.write_text(json.dumps(study))
        try:
            loaded = load_trials(path, format="ctgov")
        except VerdictError as e:
            raise InvalidInput("unreadable ClinicalTrials.gov study", [("ctgov_study", e.summary)]) from None
    if loaded.problems or len(loaded.items) != 1:
        msgs = [p.replace("study.json", "study") for p in loaded.problems] or ["expected exactly one study"]
        raise InvalidInput("unreadable ClinicalTrials.gov study", [("ctgov_study", m) for m in msgs])
    return loaded.items[0]


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class MatchingService:
    def __init__(
        self,
        config: ApiConfig,
        base_url: str,
        *,
        audit: AuditStore | None = None,
        metrics: ServiceMetrics | None = None,
    ):
        self.config = config
        self.base_url = base_url.rstrip("/")
        fc = config.formalizer
        self.egress = EgressPolicy.from_config(config.egress)
        self._check_allowlist()
        parser_ep = fc.endpoint(fc.parser_model, self.base_url)
        miner_ep = fc.endpoint(fc.value_miner_model, self.base_url)
        # One client for both adapters: one bound on requests in flight towards the server.
        self.client = EndpointClient(parser_ep, egress=self.egress)
        self.parser = Formalizer(
            parser_ep, egress=self.egress, prompts=fc.prompts, run="serve", client=self.client
        )
        self.miner = Formalizer(
            miner_ep, egress=self.egress, prompts=fc.prompts, run="serve", client=self.client
        )
        self.audit = audit or AuditStore(config.audit_db, store_notes=config.store_notes)
        self.metrics = metrics or ServiceMetrics()
        self.engine = Engine(timeout_ms=config.solver_timeout_ms, alternatives=config.alternatives)
        self._parse_locks: dict[str, asyncio.Lock] = {}
        self._programs: OrderedDict[str, TrialProgram] = OrderedDict()
        self._base_model: str | None = None

    def _check_allowlist(self) -> None:
        """Refuse to start if patient text could go to a host the site has not allowed."""
        host = urlsplit(self.base_url).hostname or ""
        if not self.egress.host_allowed(host):
            raise ServeConfigError(
                f"refusing to start: the formalizer host '{host}' is not on the site allowlist for patient "
                f"text (rule: {EGRESS_RULE}); add it to api.egress.allow_hosts in the serve config or to "
                f"${EGRESS_ENV}"
            )

    def warm_up(self) -> None:
        """Pay the first request's one-time costs at start (client library import, output schemas)."""
        import openai  # noqa: F401

        core_schema("parsed-trial")
        core_schema("value-miner")

    async def aclose(self) -> None:
        await self.client.aclose()

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
            return self._trial_response(self.upload_program(req.program, caller), cached=False)
        doc = trial_doc(req.text) if req.text is not None else ctgov_doc(req.ctgov_study)
        row, cached = await self.parsed_trial(doc, caller)
        return self._trial_response(row, cached)

    def upload_program(self, data: dict, caller: str) -> TrialRow:
        """A reviewed program: checked like parser output, then it supersedes it for its trial id."""
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
            self.engine.check_satisfiable(program)
        except ProgramError as e:
            raise InvalidInput(
                e.summary, [("program", p) for p in e.problems] or [("program", e.summary)]
            ) from None
        program = program.model_copy(
            update={"provenance": program.provenance or Provenance(source="upload", details={"key": caller})}
        )
        existing = self.audit.latest_trial(program.trial_id)
        if (
            existing is not None
            and existing.program_hash == program.content_hash
            and existing.origin == "upload"
        ):
            return existing
        return self.audit.add_trial(
            trial_id=program.trial_id,
            program_hash=program.content_hash,
            program_json=program.model_dump_json(by_alias=True),
            origin="upload",
            created_by=caller,
        )

    async def parsed_trial(self, doc: TrialDoc, caller: str) -> tuple[TrialRow, bool]:
        """The program for this criteria text: from the parse cache, or parsed once (concurrent
        requests for the same text wait for the one parse)."""
        messages = self.parser.parser_messages(doc)
        key, _ = self.parser.request_key("parser", messages, core_schema("parsed-trial"), "parsed_trial")
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
        row = (
            self.audit.trial_version(trial_id, program_hash)
            if program_hash
            else self.audit.latest_trial(trial_id)
        )
        if row is None:
            what = f"trial '{trial_id}'" + (f" version {program_hash}" if program_hash else "")
            raise NotFound(f"no {what}: register it with POST /v1/trials")
        return self._trial_response(row, cached=True)

    def _trial_response(self, row: TrialRow, cached: bool) -> TrialResponse:
        return TrialResponse(
            trial_id=row.trial_id,
            program_hash=row.program_hash,
            origin=row.origin,
            cached=cached,
            parser_model=row.parser_model,
            prompt_version=row.prompt_version,
            created_at=row.created_at,
            program=self.program_of(row),
        )

    # -- matching --------------------------------------------------------------------------------
    async def match(self, req: MatchRequest, caller: str) -> MatchResponse:
        t_start = time.perf_counter()
        timings: dict[str, float] = {}
        policy = self.policy(req.policy)
        if req.trial is not None:
            t0 = time.perf_counter()
            row, cached = await self.parsed_trial(trial_doc(req.trial), caller)
            timings["parse"] = _ms(t0)
        else:
            row = (
                self.audit.trial_version(req.trial_id, req.program_hash)
                if req.program_hash
                else self.audit.latest_trial(req.trial_id)
            )
            if row is None:
                raise NotFound(
                    f"no trial '{req.trial_id}'"
                    + (f" version {req.program_hash}" if req.program_hash else "")
                    + ": register it with POST /v1/trials",
                    [("trial_id", "unknown trial")],
                )
            cached = True
        program = self.program_of(row)
        note, pid = req.patient.note, req.patient.patient_id
        self.metrics.in_flight.inc()
        try:
            t0 = time.perf_counter()
            inc, exc = await _both(
                self._stage(self.miner.mine_values(program, note, "inclusion"), "miner_inclusion", note),
                self._stage(self.miner.mine_values(program, note, "exclusion"), "miner_exclusion", note),
            )
            timings["value_miner"] = _ms(t0)
            t0 = time.perf_counter()
            try:
                patient = resolve(program, pid, list(inc.output) + list(exc.output), policy)
            except PatientError as e:  # the formalizer checks types; this is a second line of defence
                raise FormalizerFailed(
                    "value-miner output does not fit the trial program",
                    [("value_miner", p) for p in _safe(e.problems, note)],
                ) from None
            timings["resolve"] = self._observe("resolve", t0)
            t0 = time.perf_counter()
            decision = await asyncio.to_thread(self.engine.decide, program, patient)
            timings["solve"] = self._observe("solve", t0)
            t0 = time.perf_counter()
            markdown = render_markdown(program, patient, decision)
            rationale = rationale_json(program, patient, decision)
            timings["render"] = self._observe("render", t0)
            models = ModelIds(
                parser=row.parser_model,
                value_miner=self.miner.endpoint.model,
                base_model=await self.base_model(),
                endpoint=origin_of(self.base_url),
                prompts={
                    s: self.miner.prompt(s).ident for s in ("parser", "miner_inclusion", "miner_exclusion")
                },
            )
            timings["total"] = _ms(t_start)
            t0 = time.perf_counter()
            stored = self.audit.add_decision(
                created_by=caller,
                trial_id=program.trial_id,
                program_hash=program.content_hash,
                patient_id=pid,
                note_hash=_sha256(note),
                patient_hash=patient.content_hash(),
                policy_name=policy.name,
                policy_version=policy.version,
                engine_version=ENGINE_VERSION,
                decision=decision.decision,
                models=models.model_dump(),
                timings=timings,
                artifacts={
                    "decision": decision.model_dump(mode="json", by_alias=True),
                    "patient": patient.model_dump(mode="json"),
                    "value_miner": {
                        r.stage: {
                            "output": json.loads(r.output_json or "null"),
                            "attempts": len(r.attempts),
                            "prompt": r.prompt_version,
                        }
                        for r in (inc, exc)
                    },
                    "rationale_markdown": markdown,
                    "trial_origin": row.origin,
                },
                note_text=note,
            )
            self._observe("audit", t0)
        finally:
            self.metrics.in_flight.dec()
        self.metrics.decisions.labels(decision.decision).inc()
        return MatchResponse(
            decision_id=stored.decision_id,
            trial_id=program.trial_id,
            program_hash=program.content_hash,
            patient_id=pid,
            policy=policy.ref,
            decision=decision,
            patient=patient,
            rationale=rationale,
            rationale_markdown=markdown,
            models=models,
            timings_ms=timings,
            trial_cached=cached,
            links=Links(
                decision=f"/v1/decisions/{stored.decision_id}",
                page=f"/v1/decisions/{stored.decision_id}/page",
            ),
        )

    async def match_batch(self, req: BatchRequest, caller: str) -> AsyncIterator[BatchLine]:
        """Validate the whole batch first (nothing starts if a part is invalid), then stream each
        pair's result as it finishes, at most `limits.batch_concurrency` at a time."""
        n = len(req.patients) * len(req.trial_ids)
        if n > self.config.limits.max_batch_pairs:
            raise InvalidInput(
                "batch too large",
                [
                    (
                        "patients",
                        f"{len(req.patients)} patients x "
                        f"{len(req.trial_ids)} trials = {n} pairs; the limit is "
                        f"{self.config.limits.max_batch_pairs}",
                    )
                ],
            )
        unknown = [
            (f"trial_ids.{i}", f"unknown trial '{t}'")
            for i, t in enumerate(req.trial_ids)
            if self.audit.latest_trial(t) is None
        ]
        if unknown:
            raise InvalidInput("unknown trials in batch: register them with POST /v1/trials", unknown)
        self.policy(req.policy)
        sem = asyncio.Semaphore(self.config.limits.batch_concurrency)
        pairs = [
            (i * len(req.trial_ids) + j, p, t)
            for i, p in enumerate(req.patients)
            for j, t in enumerate(req.trial_ids)
        ]

        async def one(index, patient, trial_id) -> BatchLine:
            async with sem:
                try:
                    res = await self.match(
                        MatchRequest(trial_id=trial_id, patient=patient, policy=req.policy), caller
                    )
                    return BatchLine(
                        index=index, patient_id=patient.patient_id, trial_id=trial_id, status=200, result=res
                    )
                except ServiceError as e:
                    self.metrics.errors.labels(e.code).inc()
                    return BatchLine(
                        index=index,
                        patient_id=patient.patient_id,
                        trial_id=trial_id,
                        status=e.status,
                        error=error_body(e),
                    )

        tasks = [asyncio.create_task(one(*p)) for p in pairs]
        try:
            for fut in asyncio.as_completed(tasks):
                yield await fut
        finally:  # client gone: stop the rest
            for t in tasks:
                t.cancel()

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
        )

    def program_version(self, trial_id: str, program_hash: str) -> TrialProgram:
        row = self.audit.trial_version(trial_id, program_hash)
        if row is None:
            raise NotFound(f"no trial '{trial_id}' version {program_hash}")
        return self.program_of(row)

    # -- readiness -------------------------------------------------------------------------------
    async def readiness(self) -> Readiness:
        import httpx

        wanted = [self.parser.endpoint.model, self.miner.endpoint.model]
        origin = origin_of(self.base_url)
        try:
            async with httpx.AsyncClient(timeout=3.0, trust_env=False) as http:
                r = await http.get(self.base_url + "/models", headers=self._auth_headers())
            r.raise_for_status()
            data = r.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            return Readiness(
                ready=False, formalizer=origin, reason=f"formalizer not answering ({type(e).__name__})"
            )
        ids = [m.get("id") for m in data if isinstance(m, dict)]
        for m in data:
            if isinstance(m, dict) and m.get("id") in wanted and m.get("parent"):
                self._base_model = m["parent"]
        missing = [w for w in wanted if w not in ids]
        return Readiness(
            ready=not missing,
            formalizer=origin,
            models=ids,
            missing=missing,
            reason=f"formalizer lacks {', '.join(missing)}" if missing else None,
        )

    async def base_model(self) -> str | None:
        if self._base_model is None:
            await self.readiness()
        return self._base_model

    def _auth_headers(self) -> dict[str, str]:
        import os

        env = self.config.formalizer.api_key_env
        return {"Authorization": f"Bearer {os.environ[env]}"} if env and os.environ.get(env) else {}

    # -- one formalizer stage, with failure mapping and metrics ----------------------------------
    async def _stage(self, call, stage: str, note: str | None = None) -> StageResult:
        t0 = time.perf_counter()
        try:
            res: StageResult = await call
        except EndpointError as e:
            if e.retryable:
                raise FormalizerUnavailable(
                    f"the formalizer ({stage}) is unavailable: {_safe([str(e)], note)[0]}",
                    headers={"Retry-After": str(self.config.retry_after_s)},
                ) from None
            raise FormalizerFailed(f"the formalizer ({stage}) failed: {_safe([str(e)], note)[0]}") from None
        except EgressRefused as e:
            raise FormalizerFailed(str(e)) from None
        finally:
            self.metrics.observe_stage(stage, time.perf_counter() - t0)
        self.metrics.tokens.labels(stage, "prompt").inc(res.usage.prompt_tokens)
        self.metrics.tokens.labels(stage, "completion").inc(res.usage.completion_tokens)
        if len(res.attempts) > 1:
            self.metrics.repairs.labels(stage, res.status).inc()
        if not res.accepted:
            log.warning("stage=%s rejected after repair reason=%s", stage, res.reason)
            raise FormalizerFailed(
                f"the {stage} output failed validation after one repair attempt (reason: {res.reason})",
                [(stage, p) for p in _safe(res.problems, note)][:20],
            )
        return res

    def _observe(self, stage: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.metrics.observe_stage(stage, dt)
        return round(dt * 1000, 3)


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


def _safe(messages: list[str], note: str | None) -> list[str]:
    if not note:
        return list(messages)
    return [PROBLEM_WITHHELD if quotes_any(m, (note,)) else m for m in messages]


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
