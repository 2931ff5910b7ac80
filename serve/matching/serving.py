"""The match routes' logic: trial -> value miner (both sides) -> policy -> core -> rationale -> audit.

The trial comes from serve/trials (parsed once, or a reviewed program); formalizer calls run through
the stage runner (serve/stage_runner.py: failure mapping, metrics). Nothing is written to the audit
store until a decision is complete, so a failed request leaves nothing half-written.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import dataclass

from verdict.core.decision import ENGINE_VERSION, Decision
from verdict.core.errors import PatientError, PolicyError, VerdictError
from verdict.core.patient import ResolvedPatient
from verdict.core.policy import Policy, load_policy, resolve
from verdict.core.program import TrialProgram
from verdict.core.settled import settles
from verdict.core.solver_pool import SolverPool
from verdict.data_gen.fhir.models import FhirPatientRecord
from verdict.data_gen.fhir.resolve import CodedResolutions, coded_resolutions
from verdict.data_gen.formalizer import (
    MinedValues,
    PairCost,
    PatientDoc,
    StageResult,
    held_open,
    merge_sides,
    mine_pair,
    pair_chart_read,
    pair_cost,
)

from ..api_config import ApiConfig
from ..audit import AuditStore, DecisionRow, TrialRow
from ..audit.artifacts import typed_artifacts
from ..errors import FormalizerFailed, InvalidInput
from ..formalizers import Formalizers
from ..metrics import ServiceMetrics
from ..note_free import note_free
from ..optional_stages import DecidedPair, OptionalStages
from ..quote_hash import QuoteHasher
from ..rationale import render_rationale
from ..stage_runner import StageRunner
from ..stored_record import documents_meta, sha256_text, stored_record
from ..trial_versions import InactiveUse, TrialVersion
from ..trials.serving import TrialService, trial_doc
from .protocol import Links, MatchRequest, MatchResponse, ModelIds


@dataclass(frozen=True)
class _Inputs:
    """What one match decides on: the trial's program, the patient's record and its coded FHIR facts
    (None without FHIR), the missingness policy."""

    program: TrialProgram
    record: PatientDoc
    coded: CodedResolutions | None
    policy: Policy


@dataclass(frozen=True)
class _Decided:
    """What `MatchingService.decide` derived from the mined values: the answer and its audit artifacts."""

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
        audit: AuditStore,
        engine: SolverPool,
        metrics: ServiceMetrics,
        formalizers: Formalizers,
        stages: StageRunner,
        trials: TrialService,
        quote_hasher: QuoteHasher | None,
    ):
        self.config = config
        self.audit = audit
        self.engine = engine
        self.metrics = metrics
        self.formalizers = formalizers
        self.miner = formalizers.miner
        self.stages = stages
        self.trials = trials
        self.quote_hasher = quote_hasher
        self.optional = OptionalStages(config.formalizer, self.miner, engine, stages)

    def policy(self, name: str | None) -> Policy:
        try:
            return load_policy(name or self.config.default_policy)
        except PolicyError as e:
            raise InvalidInput("unknown policy", [("policy", e.summary)]) from None
        except VerdictError as e:
            raise InvalidInput("unknown policy", [("policy", str(e))]) from None

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
        program = self.trials.programs.program_of(row)
        record = PatientDoc(patient_id=req.patient.patient_id, documents=req.patient.documents())
        # A FHIR record's coded facts decide some atoms (verdict.data_gen.fhir.resolve), unasked of the miner.
        coded = coded_resolutions(program, req.patient.fhir) if req.patient.fhir is not None else None
        self.metrics.in_flight.inc()
        try:
            inputs = _Inputs(program, record, coded, policy)
            inc, exc = await self._mine(inputs, timings)
            d = await self._decide(inputs, inc, exc, timings)
            models = await self._models(row)
            cost = pair_cost(inc, exc)
            timings["total"] = _ms(t_start)
            stored = await self._record(req, caller, row, inputs, d, models, timings, cost, version)
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
            links=Links.of(stored.decision_id),
        )

    async def _trial_for(
        self, req: MatchRequest, caller: str, timings: dict[str, float]
    ) -> tuple[TrialRow, bool]:
        """The trial version a match uses, and whether it was cached: inline text is parsed once (a
        reviewed program of its trial id wins), a trial id is looked up as `get_trial` does."""
        if req.trial is None:
            return self.trials.trial_row(
                req.trial_id, req.program_hash, [("trial_id", "unknown trial")]
            ), True
        doc = trial_doc(req.trial)
        active = self.audit.active_trial(doc.trial_id)
        if active is not None and active.reviewed:  # inline text never overrides a reviewed program
            return active, True
        t0 = time.perf_counter()
        row, cached = await self.trials.parsed_trial(doc, caller)
        timings["parse"] = _ms(t0)
        return row, cached

    async def _mine(self, inputs: _Inputs, timings: dict[str, float]) -> tuple[StageResult, StageResult]:
        """The value miner's inclusion and exclusion passes (atoms `coded` decides skipped): staged
        (`api.formalizer.staged_mining`, data_gen/formalizer/staged.py: the exclusion side first, the
        inclusion side only when it can change the decision), else both concurrently."""
        program, record, coded = inputs.program, inputs.record, inputs.coded
        note = record.text  # every document's text: what error messages must never quote
        skip = coded.decided if coded is not None else frozenset()
        t0 = time.perf_counter()

        def side(s: str):
            return self.stages.run(self.miner.mine_values(program, record, s, skip=skip), f"miner_{s}", note)

        if self.config.formalizer.staged_mining:
            pair = await mine_pair(
                self.miner,
                self.engine,
                program,
                record,
                inputs.policy,
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
        self, inputs: _Inputs, inc: StageResult, exc: StageResult, timings: dict[str, float]
    ) -> _Decided:
        """Mined values -> resolved patient (policy, coded facts) -> the core's decision (the opt-in
        arbiter may decide again) -> rationale (and the opt-in verbalizer's prose)."""
        program, record, coded = inputs.program, inputs.record, inputs.coded
        t0 = time.perf_counter()
        mined = merge_sides(inc.output, exc.output)  # passages, documents and sides: one merge rule
        try:
            patient = resolve(
                program,
                record.patient_id,
                list(mined),
                inputs.policy,
                held_open=held_open(inc, exc),  # conflicts, unread and unasked atoms
                sources=mined.sources,
            )
        except PatientError as e:  # the formalizer checks types; this is a second line of defence
            raise values_unfit(e) from None
        if coded is not None:
            patient = coded.apply(patient)
        timings["resolve"] = self._observe("resolve", t0)
        t0 = time.perf_counter()
        decision = await self.engine.adecide(program, patient)
        timings["solve"] = self._observe("solve", t0)
        # Opt-in (api.formalizer.arbiter): facts contradicting definitions re-read, decided again.
        decided, arbiter = await self.optional.arbitrate(
            DecidedPair(program, record, patient, decision), timings
        )
        decision = decided.decision
        t0 = time.perf_counter()
        markdown, rationale = render_rationale(program, patient, decision, mined.conflicts, arbiter)
        timings["render"] = self._observe("render", t0)
        # Opt-in (api.formalizer.verbalizer): prose restating the decision; decides nothing.
        rationale_text, verbalizer = await self.optional.verbalize(decided, timings)
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
            base_model=await self.formalizers.base_model(),
            endpoint=self.formalizers.label,
            prompts={s: self.miner.prompt(s).ident for s in ("parser", "miner_inclusion", "miner_exclusion")},
            files=await asyncio.to_thread(self.formalizers.model_files.pins),
        )

    async def _record(
        self,
        req: MatchRequest,
        caller: str,
        row: TrialRow,
        inputs: _Inputs,
        d: _Decided,
        models: ModelIds,
        timings: dict[str, float],
        cost: PairCost,
        version: TrialVersion,
    ) -> DecisionRow:
        """The decision's audit row: what an auditor needs to reproduce it (observed as stage 'audit')."""
        program, policy, record, coded = inputs.program, inputs.policy, inputs.record, inputs.coded
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
                note_hash=sha256_text(stored_note),
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
                            "value_miner": miner_stages(d.inc, d.exc),
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

    def _kept(self, note: str, artifacts: dict) -> dict:
        """The artifacts as the audit store keeps them: under store_notes false, no note text."""
        return artifacts if self.quote_hasher is None else note_free(artifacts, note, self.quote_hasher)

    def _observe(self, stage: str, t0: float) -> float:
        dt = time.perf_counter() - t0
        self.metrics.observe_stage(stage, dt)
        return round(dt * 1000, 3)


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


def values_unfit(e: PatientError) -> FormalizerFailed:
    """Mined values that do not fit the program, as a 502: the problems can quote values from the
    note, so they are counted only."""
    return FormalizerFailed(
        "value-miner output does not fit the trial program",
        [("value_miner", f"{len(e.problems)} problem(s) (details withheld: they may quote the note)")],
    )


def miner_stages(*results: StageResult) -> dict:
    """The value-miner stages as a decision record keeps them: per stage its output, attempts, prompt,
    calls (ids only), the documents its values came from and the atoms it left unasked."""
    return {
        r.stage: {
            "output": json.loads(r.output_json or "null"),
            "attempts": len(r.attempts),
            "prompt": r.prompt_version,
            "calls": [{"item": c.item, "attempts": len(c.attempts)} for c in r.calls],
            "sources": r.output.sources,
            "not_asked": (r.assembly or {}).get("not_asked", []),
        }
        for r in results
    }


def fhir_meta(rec: FhirPatientRecord | None, coded: CodedResolutions | None) -> dict | None:
    """Where a FHIR patient's values came from (resource ids, no text): the reference date, the atoms
    coded facts decided and why the others were left to the miner, the record's problems."""
    if rec is None or coded is None:
        return None
    return {
        "patient": rec.patient_ref,
        "reference_date": rec.reference_date,
        "coded_atoms": {r.atom: r.evidence_source for r in coded.resolutions},
        "left_for_miner": coded.notes,
        "refused": coded.refused,
        "problems": rec.problems,
    }


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 3)
