"""The formalizer runtime: one endpoint (a teacher or a student), the shared stage loop (call ->
validate -> one repair), the request cache with single flight, the ledger and the egress check.
The stages themselves live beside it: `parser.py` (trial parser), `miner.py` (value miner); the
arbiter and verbalizer stages are here.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Collection

from verdict.core.engine import Engine, apply_overrides
from verdict.core.formula import render
from verdict.core.patient import value_type_problems
from verdict.core.program import TrialProgram

from ..cache import CachedCall, CallCache, CallMeta, canonical_key
from ..client import EndpointClient, build_request
from ..egress import EgressPolicy
from ..ledger import Ledger, worst_case_cost
from ..prompt_templates import PromptTemplate, load_prompt, stage_prompt
from ..protocol import ArbiterOutput, Attempt, PatientDoc, StageResult, TrialDoc, Usage, VerbalizerOutput
from ..teacher_config import TeacherConfig
from .budget import TokenCounter, counter_for
from .checks import Check, compact, parse_output, quote_in_note, with_atom_enum
from .criteria import CriterionText
from .miner import miner_messages
from .parser import criterion_messages
from .reader import ChartReading, FactSheets
from .value_reuse import ValueReuse

log = logging.getLogger("verdict.data_gen.formalizer")


class Formalizer:
    """Formalizer stages against one endpoint (a teacher or a student)."""

    def __init__(
        self,
        endpoint: TeacherConfig,
        *,
        engine: Engine | None = None,
        cache: CallCache | None = None,
        ledger: Ledger | None = None,
        egress: EgressPolicy | None = None,
        prompts: dict[str, str] | None = None,
        run: str = "adhoc",
        client: EndpointClient | None = None,
        value_reuse: ValueReuse | None = None,
        reading: ChartReading | None = None,
    ):
        self.endpoint = endpoint
        # Mined values of a patient record reused across trials (value_reuse.py); None: mine every time.
        self.value_reuse = value_reuse
        # Long charts read once per patient record version, the fact sheets shared by every trial
        # (reader.py); None: every chart is mined whole.
        self.reading = reading
        self.fact_sheets = FactSheets()
        # The engine that checks outputs (satisfiability, the arbiter's overrides): the caller's, so
        # checks run under its solver limit and a program compiled for a check serves its decisions
        # too. Without one, the formalizer has an engine of its own (the core's default limits).
        self.engine = engine if engine is not None else Engine()
        self.cache = cache
        self.ledger = ledger
        self.client = client or EndpointClient(endpoint, egress=egress)
        self.prompts = dict(prompts or {})
        self.run = run
        self.repair_prompt = load_prompt("repair", "v1")
        # Single flight: identical requests in flight at once (e.g. the same exclusion atoms for
        # one patient across trials) share one call instead of both missing the cache.
        self._pending: dict[str, _Flight] = {}
        self._tokens: TokenCounter | None = None

    @property
    def tokens(self) -> TokenCounter:
        """Counts prompt tokens the way this endpoint's model does (or an upper estimate)."""
        if self._tokens is None:
            self._tokens = counter_for(self.endpoint.tokenizer)
        return self._tokens

    def prompt_budget(self, stage: str) -> int | None:
        """The most prompt tokens a call of this stage may carry; None: no limit configured."""
        t = self.endpoint
        if t.context_tokens is None:
            return None
        return t.context_tokens - t.max_tokens.for_stage(stage)

    async def aclose(self) -> None:
        await self.client.aclose()

    def prompt(self, stage: str) -> PromptTemplate:
        return stage_prompt(stage, self.prompts.get(stage))

    # -- requests (also used by dry runs) ----------------------------------------------------------
    def criterion_messages(self, criterion: CriterionText) -> list[dict[str, str]]:
        """The parser request of one criterion (see `parser.py`)."""
        return criterion_messages(criterion, self.prompts.get("parser", "v1"))

    def parser_key(self, trial: TrialDoc) -> str:
        """The key of a whole trial parse (criteria + endpoint + prompt version; see `parser.py`)."""
        from .parser import trial_request_key

        return trial_request_key(self, trial)

    def trial_criteria(self, trial: TrialDoc):
        """The trial's criteria as this endpoint's parser calls them (split to fit its budget)."""
        from .parser import trial_criteria

        return trial_criteria(self, trial)

    def miner_messages(
        self, program: TrialProgram, note: str, side: str, names: list[str]
    ) -> list[dict[str, str]]:
        return miner_messages(program, note, side, names, self.prompts.get(f"miner_{side}"))

    def request_key(
        self, stage: str, messages: list[dict[str, str]], schema: dict | None, schema_name: str
    ) -> tuple[str, dict]:
        """(cache key, request): the key covers the endpoint, the templates behind the messages and
        every request field, so a change to any of them is a new call."""
        request = build_request(self.endpoint, stage, messages, schema, schema_name)
        tmpl = self.prompt(stage)
        ident = {
            "endpoint": self.endpoint.endpoint_id,
            "prompt": f"{tmpl.ident}#{tmpl.sha256}",
            "repair": f"{self.repair_prompt.ident}#{self.repair_prompt.sha256}",
            "request": request,
        }
        return canonical_key(ident), request

    # -- stages ------------------------------------------------------------------------------------
    async def parse_trial(self, trial: TrialDoc) -> StageResult:
        """Criteria text -> one call per criterion -> assembled, checked TrialProgram (see `parser.py`)."""
        from .parser import parse_trial

        return await parse_trial(self, trial)

    async def mine_values(
        self,
        program: TrialProgram,
        note: PatientDoc | str,
        side: str,
        *,
        data_class: str | None = None,
        skip: Collection[str] = (),
    ) -> StageResult:
        """Patient record + the side's atoms (less `skip`) -> checked values with evidence (see
        `miner.py`); a long chart through its fact sheet, read once (see `reader.py`)."""
        from .reader import mine_chart

        return await mine_chart(self, program, note, side, data_class=data_class, skip=skip)

    async def arbitrate(
        self, program: TrialProgram, note: PatientDoc | str, patient, conflicts
    ) -> StageResult:
        """Re-read the chart for atoms whose values contradict definitions; output: list[Override]."""
        from verdict.core.decision import Override

        text = note.text if isinstance(note, PatientDoc) else note
        dclass = note.data_class if isinstance(note, PatientDoc) else "private"
        atoms = sorted({a for c in conflicts for a in c.atoms})
        defs = sorted({d for c in conflicts for d in c.definitions})
        have = patient.by_atom()
        table = program.atom_table()
        values = "\n".join(
            compact(
                {
                    "atom": a,
                    "type": table[a].domain,
                    "value": have[a].value if a in have else None,
                    "evidence": (have[a].evidence or "") if a in have else "",
                }
            )
            for a in atoms
        )
        by_id = {d.id: d for d in program.definitions}
        constraints = "\n".join(
            f"- {d}: {render(by_id[d].formula)}" + (f" ({by_id[d].text})" if by_id[d].text else "")
            for d in defs
            if d in by_id
        )
        messages = self.prompt("arbiter").render(
            NOTE=text.strip(), VALUES=values, CONSTRAINTS=constraints or "(none)"
        )
        schema = with_atom_enum(ArbiterOutput.model_json_schema(), atoms)

        def validate(call: CachedCall) -> Check:
            out, problems = parse_output(
                call.content, call.finish_reason, self.endpoint.max_tokens.arbiter, ArbiterOutput
            )
            if out is None:
                return Check(problems)
            for i, o in enumerate(out.overrides):
                where = f"overrides[{i}] '{o.atom}'"
                if o.atom not in atoms:
                    problems.append(("coverage", f"{where}: not one of the conflicting atoms"))
                    continue
                problems += [
                    ("type", f"{where}: {p}")
                    for p in value_type_problems(table[o.atom].domain, o.value, None)
                ]
                if o.value is not None and not quote_in_note(o.evidence, text):
                    problems.append(("evidence", f"{where}: evidence is not a verbatim quote from the note"))
            overrides = [Override(atom=o.atom, value=o.value, reason=o.reason) for o in out.overrides]
            if not problems and overrides:
                problems += _still_conflicting(self.engine, program, patient, overrides)
            return Check(problems, overrides, compact(out.model_dump(mode="json")))

        return await self.run_stage(
            "arbiter",
            messages,
            schema,
            "arbiter_output",
            validate,
            patient_text=True,
            data_class=dclass,
            ids=f"trial={program.trial_id} patient={patient.patient_id}",
            sensitive=(text,),
            solver=True,
        )

    async def verbalize(
        self, program: TrialProgram, patient, decision, *, data_class: str = "private"
    ) -> StageResult:
        """Restate a Decision for clinicians; output: the rationale text. It may decide nothing."""
        try:
            from verdict.core.rationale import render_markdown

            record = render_markdown(program, patient, decision)
        except ImportError:
            record = decision.canonical_json()
        messages = self.prompt("verbalizer").render(RECORD=record)
        allowed = {_num(x) for x in _NUMBER.findall(record)}

        def validate(call: CachedCall) -> Check:
            out, problems = parse_output(
                call.content, call.finish_reason, self.endpoint.max_tokens.verbalizer, VerbalizerOutput
            )
            if out is None:
                return Check(problems)
            if out.decision != decision.decision:
                problems.append(
                    ("decision", f"decision is '{out.decision}' but the record says '{decision.decision}'")
                )
            extra = sorted({x for x in _NUMBER.findall(out.rationale) if _num(x) not in allowed})
            if extra:
                problems.append(
                    (
                        "unsupported_number",
                        f"the rationale states numbers not in the record: {', '.join(extra[:8])}",
                    )
                )
            return Check(problems, out.rationale, compact(out.model_dump(mode="json")))

        return await self.run_stage(
            "verbalizer",
            messages,
            VerbalizerOutput.model_json_schema(),
            "verbalizer_output",
            validate,
            patient_text=True,
            data_class=data_class,
            ids=f"trial={program.trial_id} patient={patient.patient_id}",
            sensitive=(record,),
        )

    # -- the shared stage loop: the public stage interface ------------------------------------------
    async def run_stage(
        self,
        stage: str,
        messages: list[dict[str, str]],
        schema: dict,
        schema_name: str,
        validate: Callable[[CachedCall], Check],
        *,
        patient_text: bool,
        data_class: str,
        ids: str,
        sensitive: tuple[str, ...] = (),
        solver: bool = False,
        no_repair: Collection[str] = (),
    ) -> StageResult:
        """Run one formalizer stage: the one interface every stage (parser, miner, reader, arbiter,
        verbalizer, a bench backend's own stage) calls the endpoint through.

        `messages` are sent (from the cache when this exact request was answered before; identical
        requests in flight share one call); `validate` checks the answer and returns a `Check`; on
        problems the answer is repaired once with them fed back. `stage` names the prompt and the
        completion budget (`max_tokens.for_stage`); `schema`/`schema_name` the structured output;
        `patient_text`/`data_class` what the egress policy checks; `ids` names the item in the log
        (never text); `sensitive` are texts the client keeps out of errors; `solver`: the check runs
        the solver (run in a thread); `no_repair`: rejection reasons the caller handles itself (no
        repair is asked for them: the sparse miner splits a cut-off chunk instead). Returns the
        StageResult: accepted (with the checked output)
        or rejected (with the problems), its attempts and usage."""
        t = self.endpoint
        usage = Usage()
        attempts: list[Attempt] = []
        convo = list(messages)
        check = None
        for _attempt in range(2):  # the output, then one repair with the problems fed back
            call, cached = await self._call(
                stage, convo, schema, schema_name, patient_text, data_class, sensitive
            )
            usage = usage.add(
                Usage(
                    prompt_tokens=call.prompt_tokens,
                    completion_tokens=call.completion_tokens,
                    cost_usd=call.cost_usd,
                    paid_usd=0.0 if cached else call.cost_usd,
                    calls_paid=0 if cached else 1,
                    cache_hits=int(cached),
                    paid_prompt_tokens=0 if cached else call.prompt_tokens,
                    paid_completion_tokens=0 if cached else call.completion_tokens,
                )
            )
            # Checks that run the solver go to a thread: the event loop keeps the other calls moving.
            check = await asyncio.to_thread(validate, call) if solver else validate(call)
            attempts.append(
                Attempt(
                    key=call.key,
                    cached=cached,
                    finish_reason=call.finish_reason,
                    problems=check.messages,
                    reason=check.reason,
                )
            )
            if check.ok or check.reason in no_repair:
                break
            convo = convo + [
                {"role": "assistant", "content": call.content or ""},
                *[
                    m
                    for m in self.repair_prompt.render(
                        PROBLEMS="\n".join(f"- {p}" for p in check.messages[:20])
                    )
                    if m["role"] == "user"
                ],
            ]
        assert check is not None
        status = "accepted" if check.ok else "rejected"
        log.info(
            "stage=%s %s status=%s reason=%s attempts=%d paid=%d",
            stage,
            ids,
            status,
            check.reason or "-",
            len(attempts),
            usage.calls_paid,
        )
        return check.result(
            stage=stage,
            teacher=t.name,
            model=t.model,
            prompt_version=self.prompt(stage).ident,
            messages=messages,
            attempts=attempts,
            usage=usage,
        )

    async def _call(
        self,
        stage: str,
        messages: list[dict[str, str]],
        schema: dict,
        schema_name: str,
        patient_text: bool,
        data_class: str,
        sensitive: tuple[str, ...],
    ) -> tuple[CachedCall, bool]:
        """One answered call: from the cache if this exact request was ever paid for, else sent.

        Identical calls in flight share one upstream call. It runs as its own task and each caller
        awaits a shield of it, so a caller that is cancelled (its client went away, its other pass
        failed) leaves the others their answer; the call is cancelled only when nobody waits."""
        key, request = self.request_key(stage, messages, schema, schema_name)
        flight = self._pending.get(key)
        if flight is None:
            task = asyncio.ensure_future(
                self._call_once(key, request, stage, messages, patient_text, data_class, sensitive)
            )
            flight = self._pending[key] = _Flight(task)
            task.add_done_callback(lambda _t, k=key, f=flight: self._forget(k, f))
        flight.waiters += 1
        try:
            call, cached = await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                self._forget(key, flight)  # a new caller starts afresh instead of joining a cancelled call
                flight.task.cancel()
        if flight.claimed:  # the call was answered once already: the others count it as a hit
            if self.cache is not None:
                await asyncio.to_thread(self.cache.record_hit, call, self._meta(stage))
            return call, True
        flight.claimed = True
        return call, cached

    def _forget(self, key: str, flight: _Flight) -> None:
        if self._pending.get(key) is flight:
            del self._pending[key]

    def _meta(self, stage: str) -> CallMeta:
        t = self.endpoint
        return CallMeta(
            run=self.run,
            stage=stage,
            teacher=t.name,
            endpoint=t.endpoint_id,
            model=t.model,
            prompt=self.prompt(stage).ident,
        )

    async def _call_once(
        self,
        key: str,
        request: dict,
        stage: str,
        messages: list[dict[str, str]],
        patient_text: bool,
        data_class: str,
        sensitive: tuple[str, ...],
    ) -> tuple[CachedCall, bool]:
        t = self.endpoint
        meta = self._meta(stage)
        if self.cache is not None:
            hit = self.cache.get(key)  # a read: never waits for a write in progress
            if hit is not None:
                await asyncio.to_thread(self.cache.record_hit, hit, meta)
                return hit, True
        what = f"stage '{stage}' of teacher '{t.name}'"
        # Egress first, so a refused request is refused whatever the budget says.
        self.client.check_egress(carries_patient_text=patient_text, data_class=data_class, what=what)
        ticket = (
            self.ledger.reserve(worst_case_cost(t, messages, t.max_tokens.for_stage(stage)))
            if self.ledger
            else None
        )
        if self.cache is not None:
            # Writes run in threads: the event loop never waits for the database lock or a sync.
            await asyncio.to_thread(self.cache.begin, key, meta)
        try:
            comp = await self.client.complete(
                request,
                carries_patient_text=patient_text,
                data_class=data_class,
                what=what,
                sensitive=sensitive,
                request_id=key,
            )
        except asyncio.CancelledError:
            if self.ledger is not None and ticket is not None:
                self.ledger.settle(ticket, None)
            raise  # the journal entry stays: the request may have reached the server
        except BaseException:
            if self.ledger is not None and ticket is not None:
                self.ledger.settle(ticket, None)
            if self.cache is not None:
                await asyncio.to_thread(self.cache.abandon, key, meta)
            raise
        cost = t.prices.cost(comp.prompt_tokens, comp.completion_tokens)
        call = CachedCall(
            key=key,
            content=comp.content,
            finish_reason=comp.finish_reason,
            prompt_tokens=comp.prompt_tokens,
            completion_tokens=comp.completion_tokens,
            cost_usd=cost,
            usage_estimated=comp.usage_estimated,
            attempts=comp.attempts,
            latency_s=comp.latency_s,
        )
        if self.cache is not None:
            await asyncio.to_thread(self.cache.store, call, meta)
        if self.ledger is not None and ticket is not None:
            self.ledger.settle(ticket, cost)
        return call, False


class _Flight:
    """One upstream call in flight, shared by the identical calls waiting for it."""

    def __init__(self, task: asyncio.Future):
        self.task = task
        self.waiters = 0
        self.claimed = False  # whether a waiter has taken the answer as its own (not a cache hit)


_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?")


def _num(x: str) -> float:
    return float(x)


def _still_conflicting(engine: Engine, program: TrialProgram, patient, overrides) -> list[tuple[str, str]]:
    """Apply the overrides as the engine does; any extraction conflict left is a problem."""
    d = engine.decide(program, apply_overrides(patient, overrides))
    if d.conflicts:
        atoms = sorted({a for c in d.conflicts for a in c.atoms})
        return [
            (
                "consistency",
                f"after the overrides these atoms still contradict the definitions: {', '.join(atoms)}",
            )
        ]
    return []
