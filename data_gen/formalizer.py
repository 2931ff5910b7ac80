"""The one implementation of a formalizer stage: render the prompt -> call an OpenAI-compatible
endpoint with structured output -> validate strictly with verdict_core -> one repair attempt with
the problems fed back -> accepted, or rejected with its reason.

Teachers (API models) and students (vLLM adapters) go through the same code:

    fz = Formalizer(load_teacher("gpt-4.1"), cache=CallCache(path), ledger=..., egress=...)
    res = await fz.parse_trial(trial)                         # StageResult, res.output: TrialProgram
    inc = await fz.mine_values(res.output, patient, "inclusion")  # res.output: list[MinedValue]

Checks (an output becomes a record only if all pass): valid JSON, not cut off at max_tokens; the
core's schema; the program compiles (`check_program`: every atom used is declared, types, ids);
it is satisfiable by some patient (`check_satisfiable`); a miner output names exactly the atoms
asked, with values of the atom's type, and every evidence quote occurs in the note after
whitespace normalization (pieces joined by "..." must each occur, in order).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import re
from dataclasses import dataclass
from typing import Callable

from pydantic import ValidationError

from verdict_core.errors import ProgramError, describe_validation_error
from verdict_core.formula import render
from verdict_core.patient import MinedValue, ValueMinerOutput, value_type_problems
from verdict_core.program import ParsedTrial, Provenance, TrialProgram, check_program

from .cache import CachedCall, CallCache, CallMeta, canonical_key
from .client import EndpointClient, build_request
from .egress import EgressPolicy
from .ledger import Ledger, worst_case_cost
from .prompt_templates import PromptTemplate, load_prompt, stage_prompt
from .protocol import (
    ArbiterOutput,
    Attempt,
    PatientDoc,
    StageResult,
    TrialDoc,
    Usage,
    VerbalizerOutput,
)
from .teacher_config import TeacherConfig

log = logging.getLogger("data_gen.formalizer")

# Rejection categories, most fundamental first: a result's reason is its first problem's category.
REASONS = ("empty", "truncated", "json", "schema", "undeclared_atom", "program", "unsatisfiable", "coverage",
           "type", "evidence", "consistency", "decision", "unsupported_number")
SIDES = ("inclusion", "exclusion")


@functools.lru_cache(maxsize=8)
def core_schema(name: str) -> dict:
    """The core's JSON Schema for structured outputs ("parsed-trial" | "value-miner"); the core
    writes it in a form xgrammar compiles. Shared: do not mutate."""
    try:
        from verdict_core.schemas import json_schema

        return json_schema(name)
    except ImportError:  # older core without schemas.py: the same models' schemas
        model = {"parsed-trial": ParsedTrial, "value-miner": ValueMinerOutput}[name]
        return model.model_json_schema(by_alias=True)


def normalize_ws(text: str) -> str:
    return " ".join(text.split())


_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…)\s*")


_QUOTE_MARKS = "\"'“”‘’"


def quote_in_note(quote: str, note: str) -> bool:
    """A verbatim quote after whitespace normalization; pieces joined by '...' must occur in order.
    One pair of quotation marks around the whole quote is not part of it."""
    quote = quote.strip()
    if len(quote) >= 2 and quote[0] in _QUOTE_MARKS and quote[-1] in _QUOTE_MARKS:
        quote = quote[1:-1]
    hay = normalize_ws(note)
    pos = 0
    pieces = [normalize_ws(p) for p in _ELLIPSIS.split(quote)]
    pieces = [p for p in pieces if p]
    if not pieces:
        return False
    for p in pieces:
        i = hay.find(p, pos)
        if i < 0:
            return False
        pos = i + len(p)
    return True


def side_atoms(program: TrialProgram, side: str) -> list[str]:
    """The atoms a value-miner pass asks about: those the side's criteria use (through definitions too)."""
    sides = program.atom_sides()
    return [a.name for a in program.atoms if side in sides.get(a.name, set())]


def render_atoms(program: TrialProgram, names: list[str]) -> str:
    table = program.atom_table()
    lines = []
    for n in names:
        a = table[n]
        d = {"name": a.name, "type": a.domain, "kind": a.kind}
        if a.unit:
            d["unit"] = a.unit
        d["definition"] = a.definition
        if a.time_scope:
            d["time_scope"] = a.time_scope.model_dump(exclude_none=True)
        lines.append(json.dumps(d, ensure_ascii=False))
    return "\n".join(lines)


def with_atom_enum(schema: dict, names: list[str]) -> dict:
    """The value-miner schema with `atom` restricted to this pass's atoms (xgrammar enforces it)."""
    out = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and "atom" in props and "value" in props:
                props["atom"] = {"type": "string", "enum": list(names)}
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    return out


def compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Check:
    """Outcome of validating one output."""

    problems: list[tuple[str, str]]  # (category, message)
    output: object = None
    output_json: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str | None:
        if not self.problems:
            return None
        return min((c for c, _ in self.problems), key=lambda c: REASONS.index(c) if c in REASONS else len(REASONS))

    @property
    def messages(self) -> list[str]:
        return [m for _, m in self.problems]


def parse_json(content: str | None, finish_reason: str | None, max_tokens: int) -> tuple[object, list[tuple[str, str]]]:
    text = (content or "").strip()
    problems: list[tuple[str, str]] = []
    if finish_reason == "length":
        problems.append(("truncated", f"the output was cut off at the token limit ({max_tokens}); "
                                      "return a complete, shorter JSON object"))
    if not text:
        return None, problems or [("empty", "the output was empty")]
    if text.startswith("```"):  # models sometimes fence JSON; the content inside is what counts
        text = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", text)
    try:
        return json.loads(text), problems
    except ValueError as e:
        return None, problems or [("json", f"not valid JSON: {getattr(e, 'msg', e)} at character {getattr(e, 'pos', '?')}")]


# ---- prompts and checks (shared by the Formalizer, the recorded teacher and dry runs) ------------------
def parser_messages(trial: TrialDoc, version: str = "v1") -> list[dict[str, str]]:
    return stage_prompt("parser", version).render(TRIAL_ID=trial.trial_id, TITLE=trial.title or "(untitled)",
                                                  CRITERIA=trial.criteria_text())


def miner_messages(program: TrialProgram, note: str, side: str, names: list[str], version: str = "v1") -> list[dict[str, str]]:
    return stage_prompt(f"miner_{side}", version).render(NOTE=note.strip(), ATOMS=render_atoms(program, names))


def check_parser_output(content: str | None, finish_reason: str | None, trial: TrialDoc, *, model: str, teacher: str,
                        prompt: str, max_tokens: int) -> Check:
    """JSON -> ParsedTrial schema -> check_program -> check_satisfiable. Output: the TrialProgram."""
    obj, problems = parse_json(content, finish_reason, max_tokens)
    if problems:
        return Check(problems)
    try:
        parsed = ParsedTrial.model_validate(obj)
    except ValidationError as e:
        return Check([("schema", p) for p in describe_validation_error(e, "output")])
    try:
        program = check_program(TrialProgram(
            trial_id=trial.trial_id, title=trial.title, **parsed.model_dump(by_alias=True),
            provenance=Provenance(source=f"parser:{model}", details={"teacher": teacher, "prompt": prompt}),
        ))
    except ValidationError as e:  # e.g. a trial id the core does not accept
        return Check([("schema", p) for p in describe_validation_error(e, "program")])
    except ProgramError as e:
        return Check([("undeclared_atom" if "undeclared atom" in p else "program", p) for p in e.problems]
                     or [("program", e.summary)])
    try:
        _check_satisfiable(program)
    except ProgramError as e:
        return Check([("unsatisfiable", p) for p in e.problems] or [("unsatisfiable", e.summary)])
    return Check([], program, compact(parsed.model_dump(mode="json", by_alias=True, exclude_defaults=True)))


def check_miner_output(content: str | None, finish_reason: str | None, program: TrialProgram, names: list[str],
                       note: str, *, max_tokens: int) -> Check:
    """JSON -> ValueMinerOutput schema -> exactly the asked atoms, typed, with verbatim evidence.
    Output: the values in the prompt's atom order (the canonical training target)."""
    obj, problems = parse_json(content, finish_reason, max_tokens)
    if problems:
        return Check(problems)
    try:
        out = ValueMinerOutput.model_validate(obj)
    except ValidationError as e:
        return Check([("schema", p) for p in describe_validation_error(e, "output")])
    table = program.atom_table()
    asked = set(names)
    got: dict[str, MinedValue] = {}
    for i, mv in enumerate(out.values):
        where = f"values[{i}] '{mv.atom}'"
        if mv.atom not in table:
            problems.append(("undeclared_atom", f"{where}: not an atom of the trial program"))
            continue
        if mv.atom not in asked:
            problems.append(("coverage", f"{where}: not asked in this pass"))
            continue
        if mv.atom in got:
            problems.append(("coverage", f"{where}: reported twice"))
            continue
        got[mv.atom] = mv
        problems += [("type", f"{where}: {p}") for p in value_type_problems(table[mv.atom].domain, mv.value, mv.bounds)]
        if mv.value is not None and mv.bounds is not None:
            problems.append(("type", f"{where}: give a value or bounds, not both"))
        has_value = mv.value is not None or mv.bounds is not None
        if has_value and not mv.evidence.strip():
            problems.append(("evidence", f"{where}: a value needs an evidence quote from the note"))
        elif mv.evidence.strip() and not quote_in_note(mv.evidence, note):
            # the message names the atom, never the quote: problems end up in logs and records
            problems.append(("evidence", f"{where}: evidence is not a verbatim quote from the note"))
    missing = [n for n in names if n not in got]
    if missing:
        problems.append(("coverage", f"atoms missing from the output: {', '.join(missing)}"))
    ordered = [got[n] for n in names if n in got]
    target = {"values": [mv.model_dump(mode="json", exclude_defaults=True) | {"value": mv.value} for mv in ordered]}
    return Check(problems, ordered, compact(target))


class Formalizer:
    """Formalizer stages against one endpoint (a teacher or a student)."""

    def __init__(self, endpoint: TeacherConfig, *, cache: CallCache | None = None, ledger: Ledger | None = None,
                 egress: EgressPolicy | None = None, prompts: dict[str, str] | None = None, run: str = "adhoc",
                 client: EndpointClient | None = None):
        self.endpoint = endpoint
        self.cache = cache
        self.ledger = ledger
        self.client = client or EndpointClient(endpoint, egress=egress)
        self.prompts = dict(prompts or {})
        self.run = run
        self.repair_prompt = load_prompt("repair", "v1")
        # Single flight: identical requests in flight at once (e.g. the same exclusion atoms for
        # one patient across trials) share one call instead of both missing the cache.
        self._pending: dict[str, asyncio.Future] = {}

    async def aclose(self) -> None:
        await self.client.aclose()

    def prompt(self, stage: str) -> PromptTemplate:
        return stage_prompt(stage, self.prompts.get(stage, "v1"))

    # -- requests (also used by dry runs) ----------------------------------------------------------
    def parser_messages(self, trial: TrialDoc) -> list[dict[str, str]]:
        return parser_messages(trial, self.prompts.get("parser", "v1"))

    def miner_messages(self, program: TrialProgram, note: str, side: str, names: list[str]) -> list[dict[str, str]]:
        return miner_messages(program, note, side, names, self.prompts.get(f"miner_{side}", "v1"))

    def request_key(self, stage: str, messages: list[dict[str, str]], schema: dict | None, schema_name: str) -> tuple[str, dict]:
        """(cache key, request): the key covers the endpoint, the templates behind the messages and
        every request field, so a change to any of them is a new call."""
        request = build_request(self.endpoint, stage, messages, schema, schema_name)
        tmpl = self.prompt(stage)
        ident = {"endpoint": self.endpoint.endpoint_id, "prompt": f"{tmpl.ident}#{tmpl.sha256}",
                 "repair": f"{self.repair_prompt.ident}#{self.repair_prompt.sha256}", "request": request}
        return canonical_key(ident), request

    # -- stages ------------------------------------------------------------------------------------
    async def parse_trial(self, trial: TrialDoc) -> StageResult:
        """Criteria text -> checked TrialProgram. Trial text is public: no egress restriction."""
        messages = self.parser_messages(trial)
        t = self.endpoint

        def validate(call: CachedCall) -> Check:
            return check_parser_output(call.content, call.finish_reason, trial, model=t.model, teacher=t.name,
                                       prompt=self.prompt("parser").ident, max_tokens=t.max_tokens.parser)

        return await self._stage("parser", messages, core_schema("parsed-trial"), "parsed_trial", validate,
                                 patient_text=False, data_class="public", ids=f"trial={trial.trial_id}", solver=True)

    async def mine_values(self, program: TrialProgram, note: PatientDoc | str, side: str, *,
                          data_class: str | None = None) -> StageResult:
        """Patient note + the side's atoms -> checked values with evidence (one value-miner pass)."""
        if side not in SIDES:
            raise ValueError(f"side must be inclusion or exclusion (got '{side}')")
        text = note.text if isinstance(note, PatientDoc) else note
        pid = note.patient_id if isinstance(note, PatientDoc) else "-"
        dclass = data_class or (note.data_class if isinstance(note, PatientDoc) else "private")
        names = side_atoms(program, side)
        stage = f"miner_{side}"
        messages = self.miner_messages(program, text, side, names)
        if not names:  # nothing to ask: no call, an empty (trivially valid) answer
            return StageResult(stage=stage, status="accepted", teacher=self.endpoint.name, model=self.endpoint.model,
                               prompt_version=self.prompt(stage).ident, messages=messages,
                               output_json=compact({"values": []}), output=[])
        schema = with_atom_enum(core_schema("value-miner"), names)

        def validate(call: CachedCall) -> Check:
            return check_miner_output(call.content, call.finish_reason, program, names, text,
                                      max_tokens=self.endpoint.max_tokens.for_stage(stage))

        return await self._stage(stage, messages, schema, "value_miner_output", validate, patient_text=True,
                                 data_class=dclass, ids=f"trial={program.trial_id} patient={pid}", sensitive=(text,))

    async def arbitrate(self, program: TrialProgram, note: PatientDoc | str, patient, conflicts) -> StageResult:
        """Re-read the chart for atoms whose values contradict definitions; output: list[Override]."""
        from verdict_core.decision import Override

        text = note.text if isinstance(note, PatientDoc) else note
        dclass = note.data_class if isinstance(note, PatientDoc) else "private"
        atoms = sorted({a for c in conflicts for a in c.atoms})
        defs = sorted({d for c in conflicts for d in c.definitions})
        have = patient.by_atom()
        table = program.atom_table()
        values = "\n".join(compact({"atom": a, "type": table[a].domain, "value": have[a].value if a in have else None,
                                    "evidence": (have[a].evidence or "") if a in have else ""}) for a in atoms)
        by_id = {d.id: d for d in program.definitions}
        constraints = "\n".join(f"- {d}: {render(by_id[d].formula)}" + (f" ({by_id[d].text})" if by_id[d].text else "")
                                for d in defs if d in by_id)
        messages = self.prompt("arbiter").render(NOTE=text.strip(), VALUES=values, CONSTRAINTS=constraints or "(none)")
        schema = with_atom_enum(ArbiterOutput.model_json_schema(), atoms)

        def validate(call: CachedCall) -> Check:
            obj, problems = parse_json(call.content, call.finish_reason, self.endpoint.max_tokens.arbiter)
            if problems:
                return Check(problems)
            try:
                out = ArbiterOutput.model_validate(obj)
            except ValidationError as e:
                return Check([("schema", p) for p in describe_validation_error(e, "output")])
            for i, o in enumerate(out.overrides):
                where = f"overrides[{i}] '{o.atom}'"
                if o.atom not in atoms:
                    problems.append(("coverage", f"{where}: not one of the conflicting atoms"))
                    continue
                problems += [("type", f"{where}: {p}") for p in value_type_problems(table[o.atom].domain, o.value, None)]
                if o.value is not None and not quote_in_note(o.evidence, text):
                    problems.append(("evidence", f"{where}: evidence is not a verbatim quote from the note"))
            overrides = [Override(atom=o.atom, value=o.value, reason=o.reason) for o in out.overrides]
            if not problems and overrides:
                problems += _still_conflicting(program, patient, overrides)
            return Check(problems, overrides, compact(out.model_dump(mode="json")))

        return await self._stage("arbiter", messages, schema, "arbiter_output", validate, patient_text=True,
                                 data_class=dclass, ids=f"trial={program.trial_id} patient={patient.patient_id}",
                                 sensitive=(text,), solver=True)

    async def verbalize(self, program: TrialProgram, patient, decision, *, data_class: str = "private") -> StageResult:
        """Restate a Decision for clinicians; output: the rationale text. It may decide nothing."""
        try:
            from verdict_core.rationale import render_markdown

            record = render_markdown(program, patient, decision)
        except ImportError:
            record = decision.canonical_json()
        messages = self.prompt("verbalizer").render(RECORD=record)
        allowed = {_num(x) for x in _NUMBER.findall(record)}

        def validate(call: CachedCall) -> Check:
            obj, problems = parse_json(call.content, call.finish_reason, self.endpoint.max_tokens.verbalizer)
            if problems:
                return Check(problems)
            try:
                out = VerbalizerOutput.model_validate(obj)
            except ValidationError as e:
                return Check([("schema", p) for p in describe_validation_error(e, "output")])
            if out.decision != decision.decision:
                problems.append(("decision", f"decision is '{out.decision}' but the record says '{decision.decision}'"))
            extra = sorted({x for x in _NUMBER.findall(out.rationale) if _num(x) not in allowed})
            if extra:
                problems.append(("unsupported_number", f"the rationale states numbers not in the record: {', '.join(extra[:8])}"))
            return Check(problems, out.rationale, compact(out.model_dump(mode="json")))

        return await self._stage("verbalizer", messages, VerbalizerOutput.model_json_schema(), "verbalizer_output",
                                 validate, patient_text=True, data_class=data_class,
                                 ids=f"trial={program.trial_id} patient={patient.patient_id}", sensitive=(record,))

    # -- the shared stage loop ---------------------------------------------------------------------
    async def _stage(self, stage: str, messages: list[dict[str, str]], schema: dict, schema_name: str,
                     validate: Callable[[CachedCall], Check], *, patient_text: bool, data_class: str, ids: str,
                     sensitive: tuple[str, ...] = (), solver: bool = False) -> StageResult:
        t = self.endpoint
        usage = Usage()
        attempts: list[Attempt] = []
        convo = list(messages)
        check = None
        for attempt in range(2):  # the output, then one repair with the problems fed back
            call, cached = await self._call(stage, convo, schema, schema_name, patient_text, data_class, sensitive)
            usage = usage.add(Usage(prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens,
                                    cost_usd=call.cost_usd, paid_usd=0.0 if cached else call.cost_usd,
                                    calls_paid=0 if cached else 1, cache_hits=int(cached)))
            # Checks that run the solver go to a thread: the event loop keeps the other calls moving.
            check = await asyncio.to_thread(validate, call) if solver else validate(call)
            attempts.append(Attempt(key=call.key, cached=cached, finish_reason=call.finish_reason,
                                    problems=check.messages, reason=check.reason))
            if check.ok:
                break
            convo = convo + [
                {"role": "assistant", "content": call.content or ""},
                *[m for m in self.repair_prompt.render(PROBLEMS="\n".join(f"- {p}" for p in check.messages[:20]))
                  if m["role"] == "user"],
            ]
        assert check is not None
        status = "accepted" if check.ok else "rejected"
        log.info("stage=%s %s status=%s reason=%s attempts=%d paid=%d", stage, ids, status, check.reason or "-",
                 len(attempts), usage.calls_paid)
        return StageResult(
            stage=stage, status=status, reason=check.reason, problems=check.messages, teacher=t.name, model=t.model,
            prompt_version=self.prompt(stage).ident, messages=messages,
            output_json=check.output_json if check.ok else None, output=check.output if check.ok else None,
            attempts=attempts, usage=usage,
        )

    async def _call(self, stage: str, messages: list[dict[str, str]], schema: dict, schema_name: str,
                    patient_text: bool, data_class: str, sensitive: tuple[str, ...]) -> tuple[CachedCall, bool]:
        """One answered call: from the cache if this exact request was ever paid for, else sent."""
        key, request = self.request_key(stage, messages, schema, schema_name)
        pending = self._pending.get(key)
        if pending is not None:
            call = await asyncio.shield(pending)
            if self.cache is not None:
                await asyncio.to_thread(self.cache.record_hit, call, self._meta(stage))
            return call, True
        fut = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        try:
            call, cached = await self._call_once(key, request, stage, messages, patient_text, data_class, sensitive)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: waiters re-raise it, nobody else has to
            raise
        finally:
            self._pending.pop(key, None)
        fut.set_result(call)
        return call, cached

    def _meta(self, stage: str) -> CallMeta:
        t = self.endpoint
        return CallMeta(run=self.run, stage=stage, teacher=t.name, endpoint=t.endpoint_id, model=t.model,
                        prompt=self.prompt(stage).ident)

    async def _call_once(self, key: str, request: dict, stage: str, messages: list[dict[str, str]],
                         patient_text: bool, data_class: str, sensitive: tuple[str, ...]) -> tuple[CachedCall, bool]:
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
        ticket = self.ledger.reserve(worst_case_cost(t, messages, t.max_tokens.for_stage(stage))) if self.ledger else None
        if self.cache is not None:
            # Writes run in threads: the event loop never waits for the database lock or a sync.
            await asyncio.to_thread(self.cache.begin, key, meta)
        try:
            comp = await self.client.complete(request, carries_patient_text=patient_text, data_class=data_class,
                                              what=what, sensitive=sensitive, request_id=key)
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
        call = CachedCall(key=key, content=comp.content, finish_reason=comp.finish_reason,
                          prompt_tokens=comp.prompt_tokens, completion_tokens=comp.completion_tokens, cost_usd=cost,
                          usage_estimated=comp.usage_estimated, attempts=comp.attempts, latency_s=comp.latency_s)
        if self.cache is not None:
            await asyncio.to_thread(self.cache.store, call, meta)
        if self.ledger is not None and ticket is not None:
            self.ledger.settle(ticket, cost)
        return call, False


_NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:\.\d+)?")


def _num(x: str) -> float:
    return float(x)


def _check_satisfiable(program: TrialProgram) -> None:
    from verdict_core.engine import check_satisfiable

    check_satisfiable(program)


def _still_conflicting(program: TrialProgram, patient, overrides) -> list[tuple[str, str]]:
    """Apply the overrides as facts; any extraction conflict left is a problem."""
    from verdict_core.engine import Engine
    from verdict_core.patient import Resolution

    by_atom = {o.atom: o for o in overrides}

    def patch(r: Resolution) -> Resolution:
        o = by_atom.get(r.atom)
        if o is None:
            return r
        if o.value is None:
            return Resolution(atom=r.atom, status="unresolved")
        return Resolution(atom=r.atom, status="observed", value=o.value, evidence=r.evidence)

    patched = patient.model_copy(update={"resolutions": [patch(r) for r in patient.resolutions]})
    d = Engine(alternatives=0).decide(program, patched)
    if d.conflicts:
        atoms = sorted({a for c in d.conflicts for a in c.atoms})
        return [("consistency", f"after the overrides these atoms still contradict the definitions: {', '.join(atoms)}")]
    return []
