"""The trial routes' logic: criteria text or a ClinicalTrials.gov study -> the parser student -> a
checked trial program, parsed once and cached by content (the audit store is the cache); or a
reviewed program uploaded by a person. Which version a match uses: verdict.serve.audit.store.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib

from pydantic import TypeAdapter, ValidationError
from verdict.core.errors import ProgramError, VerdictError
from verdict.core.program import Id, Provenance, TrialProgram, check_program
from verdict.core.solver_pool import SolverPool
from verdict.data_gen.formalizer import Formalizer, TrialDoc
from verdict.data_gen.sources import ctgov_studies

from ..audit import AuditStore, TrialRow
from ..errors import InvalidInput, NotFound
from ..metrics import ServiceMetrics
from ..program_cache import ProgramCache
from ..stage_runner import StageRunner
from .protocol import TrialRequest, TrialResponse, TrialText


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


class TrialService:
    def __init__(
        self,
        audit: AuditStore,
        engine: SolverPool,
        parser: Formalizer,
        stages: StageRunner,
        metrics: ServiceMetrics,
        programs: ProgramCache,
    ):
        self.audit = audit
        self.engine = engine
        self.parser = parser
        self.stages = stages
        self.metrics = metrics
        self.programs = programs
        self._parse_locks: dict[str, asyncio.Lock] = {}

    async def register_trial(self, req: TrialRequest, caller: str) -> TrialResponse:
        if req.program is not None:
            row = await self.upload_program(req.program, caller)
            return self.trial_response(row, cached=False)
        doc = trial_doc(req.text) if req.text is not None else ctgov_doc(req.ctgov_study)
        row, cached = await self.parsed_trial(doc, caller)
        return self.trial_response(row, cached)

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
                    res = await self.stages.run(self.parser.parse_trial(doc), "parse")
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
        return self.trial_response(self.trial_row(trial_id, program_hash), cached=True)

    def trial_row(
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

    def trial_response(self, row: TrialRow, cached: bool) -> TrialResponse:
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
            program=self.programs.program_of(row),
        )

    def program_version(self, trial_id: str, program_hash: str) -> TrialProgram:
        row = self.audit.trial_version(trial_id, program_hash)
        if row is None:
            raise NotFound(f"no trial '{trial_id}' version {program_hash}")
        return self.programs.program_of(row)
