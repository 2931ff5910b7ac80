"""The chart is read once per patient record version (issue 23): the reader stage and the fact sheet.

A long chart is first reduced soundly (`chart.py`: the site's document selection, exact
de-duplication of copied-forward text), then read ONCE: one `reader` call per passage group (the
value miner's passage splitter and grouping, within the reader's own token limits) returns the
verbatim excerpts of the text that state facts about the patient. The check rejects an excerpt that
is not verbatim inside one passage of its call, or not found in the original document (an excerpt
spanning a paragraph that de-duplication removed). A group whose answer still fails after its one
repair is put on the sheet whole: nothing the chart says is lost.

The **fact sheet** is the kept excerpts, each with its document id, date and character offset in
the original document, in document order. Each trial's value miner then mines the sheet, one
document per source document holding only its excerpts, instead of the chart: the cost of a pair is
bounded by the sheet, not by the chart. An atom the sheet does not establish comes back null, so it
stays unresolved (never false by itself); a value whose quote spans two excerpts is not taken
(`_checked_against_sheet`): every quote is verbatim in the chart.

A chart whose reduced text is at most `ChartReading.read_above_tokens` tokens is mined directly,
as before (single-note records are unchanged). The sheet is kept per process (`FactSheets`, keyed
by the record's content, the selection, the reader prompt and the model): the second trial of a
patient makes no reader call; a rerun in a new process answers every reader call from the cache.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import Field
from verdict.core.configs import StrictModel
from verdict.core.patient import MinedValue
from verdict.core.program import TrialProgram

from .cache import CachedCall
from .chart import DocumentSelection, ReducedChart, document_day, locate, locate_span, reduce_chart
from .checks import Check, compact, normalize_ws, parse_output, split_pieces
from .findings import MinedValues
from .miner import mine_values
from .miner_prompt import miner_target, side_atoms
from .mining_plan import MinerBudgetError, PlannedCall, as_documents, group_passages, note_text
from .mining_plan import plan_for as plan_miner
from .passages import Passage, paragraph_spans, split_document
from .prompt_templates import stage_prompt
from .protocol import ChartRead, NoteDocument, PatientDoc, StageResult, Usage
from .routing import SheetRoute, SheetRouter, atom_term, excerpt_documents
from .value_reuse import record_key

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger(__name__)
STAGE = "reader"
_PROMPT_MARGIN = 8
# The share of the reader's completion budget a passage group may fill: a reader that keeps every
# word of its group must still fit (JSON quoting and escapes add to the text it copies).
_COPY_ROOM = 0.75


class ChartReading(StrictModel):
    """How a long chart is read (`api.formalizer.reading` in a serve config)."""

    enabled: bool = Field(
        True, description="read long charts once per patient; false: mine every chart whole"
    )
    read_above_tokens: int = Field(
        2048,
        ge=0,
        description="a chart of at most this many tokens (after selection and de-duplication) is "
        "mined directly, as one note: reading it first would not pay",
    )
    selection: DocumentSelection = Field(
        default_factory=DocumentSelection, description="the documents a site reads (default: every one)"
    )
    route_above_tokens: int = Field(
        4096,
        ge=0,
        description="a fact sheet of at most this many tokens is read whole by every atom chunk (in "
        "as many calls as it takes); a larger one is routed: each chunk reads the excerpts that bear "
        "on its atoms, so a pair's cost stops growing with the chart",
    )
    route_tokens: int = Field(
        2048,
        ge=64,
        description="with no model limits (an API endpoint), the most fact-sheet tokens one value-miner "
        "call reads: a larger sheet is routed, each atom chunk reading the excerpts that bear on its "
        "atoms (with limits, the call's own prompt budget decides)",
    )


class TaggedExcerpt(StrictModel):
    """A reader v2 excerpt: the verbatim text and the terms that say what it is about (routing)."""

    text: str = Field(description="verbatim from the chart text")
    terms: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="short terms naming what the excerpt states, as a trial's criteria name it",
    )


class ReaderOutput(StrictModel):
    """A reader answer: v1 lists the excerpts' texts, v2 tags each with its terms (both parse)."""

    excerpts: list[TaggedExcerpt | str] = Field(
        description="verbatim excerpts of the text, in the order of the text"
    )


class ReaderOutputV1(StrictModel):
    excerpts: list[str] = Field(description="verbatim excerpts of the text, in the order of the text")


class ReaderOutputV2(StrictModel):
    excerpts: list[TaggedExcerpt] = Field(description="verbatim excerpts, in the order of the text")


def reader_schema(version: str) -> dict:
    """The JSON schema a reader answer is held to (structured output): by prompt version."""
    return (ReaderOutputV1 if version == "v1" else ReaderOutputV2).model_json_schema()


class Excerpt(StrictModel):
    """One kept excerpt: verbatim at `offset` in document `document` of the original chart."""

    document: str
    date: str | None = None
    kind: str | None = None
    offset: int
    text: str
    terms: list[str] = Field(default_factory=list, description="what it is about (reader v2)")


@dataclass
class FactSheet:
    """The kept excerpts (document order) and how the chart was read (`ChartRead`, no text)."""

    excerpts: list[Excerpt]
    read: ChartRead
    results: list[StageResult] = field(default_factory=list)  # the reader calls (records, audit)
    router: SheetRouter | None = None  # built by the first trial that needs it, shared after

    def routing(self, count_text) -> SheetRouter:
        """The sheet's router: built by the first trial that needs it, shared after."""
        if self.router is None:
            self.router = SheetRouter.build(self.excerpts, count_text)
        return self.router

    def documents(self) -> list[NoteDocument]:
        """One document per source document with excerpts: its excerpts separated by blank lines."""
        return excerpt_documents(self.excerpts)


# ---- planning ------------------------------------------------------------------------------------
@dataclass
class ReaderCall:
    passages: list[Passage]
    messages: list[dict[str, str]]

    @property
    def call_id(self) -> str:
        first, last = self.passages[0], self.passages[-1]
        return first.id if len(self.passages) == 1 else f"{first.id}..{last.id}"


def reader_messages(text: str, version: str | None = None) -> list[dict[str, str]]:
    return stage_prompt(STAGE, version).render(NOTE=text.strip())


def plan_reader_calls(
    documents: list[NoteDocument],
    *,
    count_messages,
    count_text,
    prompt_budget: int | None,
    completion_budget: int,
    prompt_version: str | None = None,
) -> list[ReaderCall]:
    """Every reader call of a (reduced) chart: its passages, packed into groups that fit the
    prompt budget and whose verbatim copy fits the completion budget. No model needed."""
    frame = count_messages(reader_messages("", prompt_version))
    room = int(completion_budget * _COPY_ROOM)
    budget = room if prompt_budget is None else min(room, prompt_budget - frame - _PROMPT_MARGIN)
    if budget < 16:
        raise MinerBudgetError(f"{STAGE}: no room for the chart text within the model's limits")
    docs = {d.id: d for d in documents}
    passages = [p for d in documents for p in split_document(d, budget, count_text)]
    return [
        ReaderCall(g, reader_messages(note_text(g, docs), prompt_version))
        for g in group_passages(passages, docs, budget, count_text)
    ]


def plan_for(fz: Runtime, documents: list[NoteDocument]) -> list[ReaderCall]:
    """`plan_reader_calls` with the endpoint's limits and tokenizer."""
    return plan_reader_calls(documents, **fz.planner_limits(STAGE))


# ---- the check -----------------------------------------------------------------------------------
def check_reader_output(
    content: str | None,
    finish_reason: str | None,
    call: ReaderCall,
    originals: dict[str, NoteDocument],
    *,
    max_tokens: int,
    tagged: bool = False,
) -> Check:
    """JSON -> ReaderOutput -> every excerpt verbatim inside one passage of the call and found in its
    original document. Output: the excerpts with document, date, offset and terms (call order);
    `tagged` (reader v2): the output JSON gives every excerpt as an object with its terms."""
    out, problems = parse_output(content, finish_reason, max_tokens, ReaderOutput)
    if out is None:
        return Check(problems)
    kept: list[Excerpt] = []
    for i, item in enumerate(out.excerpts):
        text, terms = (item, []) if isinstance(item, str) else (item.text, item.terms)
        text = text.strip()
        where = f"excerpts[{i}]"  # never the text: problems end up in logs and records
        if not text:
            problems.append(("evidence", f"{where}: empty"))
            continue
        p = next((p for p in call.passages if locate(text, p.text) is not None), None)
        offset = None if p is None else locate(text, originals[p.document].text)
        if offset is None:
            problems.append(("evidence", f"{where}: not a verbatim excerpt of one passage of the text"))
            continue
        doc = originals[p.document]
        terms = [t.strip() for t in terms if t.strip()]
        kept.append(
            Excerpt(document=doc.id, date=doc.date, kind=doc.kind, offset=offset, text=text, terms=terms)
        )
    items = [{"text": e.text, "terms": e.terms} if tagged else e.text for e in kept]
    return Check(problems, kept, compact({"excerpts": items}))


def _whole(call: ReaderCall, originals: dict[str, NoteDocument]) -> list[Excerpt]:
    """A group whose reading failed: its passages' paragraphs, each as an excerpt (nothing lost)."""
    out = []
    for p in call.passages:
        doc = originals[p.document]
        for s, e in paragraph_spans(p.text):
            offset = locate(p.text[s:e], doc.text)
            if offset is not None:
                out.append(
                    Excerpt(document=doc.id, date=doc.date, kind=doc.kind, offset=offset, text=p.text[s:e])
                )
    return out


# ---- distillation: reader records from recorded evidence ------------------------------------------
def recorded_excerpts(note: str, quotes: list[str]) -> list[str]:
    """The reader's target for a note from the evidence quotes recorded for it (every trial): the
    pieces of the quotes (split on '...') verbatim in the note, as the note spells them, in note
    order, each once; a piece inside another kept one is left out."""
    spans = sorted(
        {s for q in quotes for p in split_pieces(q) for s in [locate_span(p, note)] if s is not None},
        key=lambda s: (s[0], -s[1]),
    )
    kept: list[tuple[int, int]] = []
    for s, e in spans:
        if kept and e <= kept[-1][1]:
            continue  # inside the previous excerpt
        kept.append((s, e))
    return [note[s:e] for s, e in kept]


def recorded_terms(excerpt: str, cited: list[tuple[str, str]]) -> list[str]:
    """The terms of a recorded excerpt: what the atoms whose recorded quote it holds are about
    (`routing.atom_term` of each, in first-cited order, at most 8)."""
    terms: list[str] = []
    hay = normalize_ws(excerpt)
    for quote, atom in cited:
        if any(normalize_ws(p) in hay for p in split_pieces(quote)):
            t = atom_term(atom)
            if t and t not in terms:
                terms.append(t)
    return terms[:8]


def recorded_reader_result(
    note: NoteDocument, cited: list[tuple[str, str]], *, teacher: str, model: str, version: str | None = None
) -> StageResult:
    """A reader record (the SFT example of the value-miner adapter's reader task): the reader prompt
    over the note, the recorded excerpts as the teacher's answer, checked as a live answer is.
    `cited`: (recorded quote, the atom name that cites it); v2 tags each excerpt with its atoms' terms."""
    tmpl = stage_prompt(STAGE, version)
    call = ReaderCall(
        [Passage(note.id, 1, 1, 0, len(note.text), note.text)], reader_messages(note.text, tmpl.version)
    )
    return recorded_call_result(call, {note.id: note}, cited, teacher=teacher, model=model, version=version)


def recorded_call_result(
    call: ReaderCall,
    originals: dict[str, NoteDocument],
    cited: list[tuple[str, str]],
    *,
    teacher: str,
    model: str,
    version: str | None = None,
) -> StageResult:
    """One planned reader call's record: the recorded excerpts of each of its passages (call order)
    as the teacher's answer, checked as a live answer is."""
    tmpl = stage_prompt(STAGE, version)
    tagged = tmpl.version != "v1"
    quotes = [q for q, _ in cited]
    items = [
        {"text": t, "terms": recorded_terms(t, cited)} if tagged else t
        for p in call.passages
        for t in recorded_excerpts(p.text, quotes)
    ]
    check = check_reader_output(
        compact({"excerpts": items}), "stop", call, originals, max_tokens=0, tagged=tagged
    )
    return check.result(
        stage=STAGE, teacher=teacher, model=model, prompt_version=tmpl.ident, messages=call.messages
    )


def recorded_sheet(
    fz: Runtime, documents: list[NoteDocument], cited: list[tuple[str, str]], *, teacher: str, model: str
) -> FactSheet:
    """The fact sheet a reader that answers the recorded excerpts makes of a chart, read as the
    service reads it (`fz.reading`'s selection, the same reader calls), with those calls' records in
    `results`: the distillation of a chart's reading and of the sheet the value miner then reads."""
    reading = fz.reading or ChartReading()
    reduced = reduce_chart(documents, reading.selection if reading.selection.active else None)
    plan = plan_for(fz, reduced.documents)
    version = fz.prompts.get(STAGE)
    results = [
        recorded_call_result(
            c, reduced.originals, cited, teacher=teacher, model=model, version=version
        ).model_copy(update={"item": c.call_id})
        for c in plan
    ]
    return fact_sheet(plan, results, reduced)


# ---- reading -------------------------------------------------------------------------------------
async def read_chart(fz: Runtime, reduced: ReducedChart, *, data_class: str, ids: str) -> FactSheet:
    """Read the reduced chart: one reader call per passage group (concurrently), the sheet in
    document order (duplicates of one excerpt kept once)."""
    plan = await asyncio.to_thread(plan_for, fz, reduced.documents)  # exact counts: off the loop
    max_tokens = fz.endpoint.max_tokens.for_stage(STAGE)
    version = fz.prompt(STAGE).version

    async def one(call: ReaderCall) -> StageResult:
        def validate(c: CachedCall) -> Check:
            return check_reader_output(
                c.content,
                c.finish_reason,
                call,
                reduced.originals,
                max_tokens=max_tokens,
                tagged=version != "v1",
            )

        res = await fz.run_stage(
            STAGE,
            call.messages,
            reader_schema(version),
            "reader_output",
            validate,
            patient_text=True,
            data_class=data_class,
            sensitive=tuple(p.text for p in call.passages),
            ids=f"{ids} call={call.call_id}",
        )
        return res.model_copy(update={"item": call.call_id})

    return fact_sheet(plan, list(await asyncio.gather(*(one(c) for c in plan))), reduced)


def fact_sheet(plan: list[ReaderCall], results: list[StageResult], reduced: ReducedChart) -> FactSheet:
    """The sheet the reader calls' results make, in document order (an excerpt two calls kept,
    once; a repeated statement, in its latest document; a rejected group, whole)."""
    order = {d.id: i for i, d in enumerate(reduced.originals.values())}
    seen: set[tuple[str, int, str]] = set()
    excerpts: list[Excerpt] = []
    whole: list[str] = []
    usage = Usage()
    for call, res in zip(plan, results):
        usage = usage.add(res.usage)
        got = res.output if res.accepted else _whole(call, reduced.originals)
        if not res.accepted:
            whole.append(call.call_id)
        for e in got:
            k = (e.document, e.offset, normalize_ws(e.text))
            if k not in seen:
                seen.add(k)
                excerpts.append(e)
    excerpts.sort(key=lambda e: (order[e.document], e.offset))
    kept = latest_copies(excerpts, reduced.originals)
    read = ChartRead(
        documents=len(reduced.originals),
        dropped=reduced.dropped,
        trimmed=reduced.trimmed,
        passages_read=sum(len(c.passages) for c in plan),
        excerpts_kept=len(kept),
        excerpts_repeated=len(excerpts) - len(kept),
        sheet_documents=list(dict.fromkeys(e.document for e in kept)),
        kept_whole=whole,
        calls=usage.calls_paid,
        cache_hits=usage.cache_hits,
        prompt_tokens=usage.paid_prompt_tokens,
        completion_tokens=usage.paid_completion_tokens,
    )
    return FactSheet(kept, read, results)


def latest_copies(excerpts: list[Excerpt], originals: dict[str, NoteDocument]) -> list[Excerpt]:
    """The excerpts with each repeated statement (the same text, whitespace aside) kept once: in the
    latest-dated document (a tie, or no dates: the later one in the chart), as copied-forward
    paragraphs are. Order kept."""
    rank = {d: (document_day(doc) or dt.date.min, i) for i, (d, doc) in enumerate(originals.items())}
    latest: dict[str, Excerpt] = {}
    for e in excerpts:
        k = normalize_ws(e.text)
        if k not in latest or rank[e.document] >= rank[latest[k].document]:
            latest[k] = e
    return [e for e in excerpts if latest[normalize_ws(e.text)] is e]


class FactSheets:
    """The per-process store of fact sheets (least recently used out): every trial of a patient
    record version shares one reading, a reading in progress included. It holds patient text and
    never leaves the process. A failed reading is forgotten: the next trial reads again."""

    def __init__(self, max_entries: int = 2_000):
        self.max_entries = max_entries
        self._sheets: OrderedDict[str, asyncio.Future] = OrderedDict()

    async def get(self, key: str, read) -> tuple[FactSheet, bool]:
        """(the sheet, whether it was reused); `read()` makes it when nobody has."""
        fut = self._sheets.get(key)
        reused = fut is not None
        if fut is None:
            fut = self._sheets[key] = asyncio.ensure_future(read())
            fut.add_done_callback(lambda f, k=key: self._settle(k, f))
            while len(self._sheets) > self.max_entries:
                self._sheets.popitem(last=False)
        else:
            self._sheets.move_to_end(key)
        return await asyncio.shield(fut), reused

    def _settle(self, key: str, fut: asyncio.Future) -> None:
        if (fut.cancelled() or fut.exception() is not None) and self._sheets.get(key) is fut:
            del self._sheets[key]


def sheet_key(fz: Runtime, docs: list[NoteDocument], selection: DocumentSelection) -> str:
    tmpl = fz.prompt(STAGE)
    base = record_key(docs, STAGE, f"{tmpl.ident}#{tmpl.sha256}", fz.endpoint.model)
    sel = json.dumps(selection.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(f"{base}|{fz.endpoint.endpoint_id}|{sel}".encode()).hexdigest()


# ---- mining against the sheet --------------------------------------------------------------------
def chart_tokens(fz: Runtime, docs: list[NoteDocument]) -> int:
    return sum(fz.tokens.count_text(d.text) for d in docs)


async def mine_chart(
    fz: Runtime,
    program: TrialProgram,
    note: PatientDoc | NoteDocument | str | list,
    side: str,
    *,
    data_class: str | None = None,
    skip: Collection[str] = (),
) -> StageResult:
    """The value miner on a chart: directly when reading is off or the chart is small, else on the
    chart's fact sheet (read once per record version, shared by every trial). `chart_read` of the
    result says how the chart was read."""
    reading: ChartReading | None = fz.reading
    docs = as_documents(note)
    pid = note.patient_id if isinstance(note, PatientDoc) else "-"
    dclass = data_class or (note.data_class if isinstance(note, PatientDoc) else "private")
    if reading is None or not reading.enabled:
        return await mine_values(fz, program, note, side, data_class=data_class, skip=skip)
    reduced = reduce_chart(docs, reading.selection if reading.selection.active else None)
    small = await asyncio.to_thread(chart_tokens, fz, reduced.documents)
    untouched = len(reduced.documents) == len(docs) and not reduced.trimmed
    if small <= reading.read_above_tokens and untouched:  # as before: single notes are unchanged
        return await mine_values(fz, program, note, side, data_class=data_class, skip=skip)
    if small <= reading.read_above_tokens or not reduced.documents:  # the reduced chart, mined whole
        whole = ChartRead(
            documents=len(docs), dropped=reduced.dropped, trimmed=reduced.trimmed, mined_whole=True
        )
        if not reduced.documents:
            return _no_text(fz, program, side, skip, whole)
        record = PatientDoc(patient_id=_pid(pid), documents=reduced.documents, data_class=dclass)
        res = await mine_values(fz, program, record, side, data_class=dclass, skip=skip)
        return res.model_copy(update={"chart_read": whole})

    async def read() -> FactSheet:
        return await read_chart(fz, reduced, data_class=dclass, ids=f"patient={pid}")

    try:
        sheet, reused = await fz.fact_sheets.get(sheet_key(fz, docs, reading.selection), read)
    except MinerBudgetError:
        # The reader's limits leave no room for chart text (a small context): the chart is mined
        # whole, as before reading once - it costs more per pair, and nothing is lost.
        log.warning("reader: no room for chart text within the model's limits; the chart is mined whole")
        whole = ChartRead(
            documents=len(docs), dropped=reduced.dropped, trimmed=reduced.trimmed, mined_whole=True
        )
        record = PatientDoc(patient_id=_pid(pid), documents=reduced.documents, data_class=dclass)
        res = await mine_values(fz, program, record, side, data_class=dclass, skip=skip)
        return res.model_copy(update={"chart_read": whole})
    chart_read = sheet.read.model_copy(update={"reused": reused})
    sheet_docs = sheet.documents()
    if not sheet_docs:  # nothing in the chart is about the patient: every atom null, no call
        return _no_text(fz, program, side, skip, chart_read)
    router = await asyncio.to_thread(sheet.routing, fz.tokens.count_text)
    route = sheet_route(program, router, reading)
    record = PatientDoc(patient_id=_pid(pid), documents=sheet_docs, data_class=dclass)
    res = await mine_values(fz, program, record, side, data_class=dclass, skip=skip, route=route)
    if res.accepted:
        res = res.model_copy(update={"output": _checked_against_sheet(res.output, sheet)})
    return res.model_copy(update={"chart_read": chart_read.model_copy(update={"routed": any(route.routed)})})


def sheet_route(program: TrialProgram, router: SheetRouter, reading: ChartReading) -> SheetRoute:
    """A fact sheet's routing for `program` under the reading's limits: the planner reads the sheet
    whole or routes it by the one rule (`routing.reads_whole`); `routed` then says, per routed call,
    whether it read less than the whole sheet."""
    return SheetRoute(program, router, reading.route_above_tokens, reading.route_tokens)


def sheet_plan(fz: Runtime, program: TrialProgram, sheet: FactSheet, side: str) -> list[PlannedCall]:
    """The value-miner calls of one trial side on a fact sheet, as `mine_chart` plans them (every
    atom of the side asked): the prompts a student of the sheet is trained on."""
    route = sheet_route(program, sheet.routing(fz.tokens.count_text), fz.reading or ChartReading())
    return plan_miner(
        fz, program, PatientDoc(patient_id="chart", documents=sheet.documents()), side, route=route
    )


def _pid(pid: str) -> str:
    return pid if pid != "-" else "chart"


def _no_text(fz: Runtime, program: TrialProgram, side: str, skip, chart_read: ChartRead) -> StageResult:
    """No text left to mine (every document dropped, or nothing kept by the reading): every atom
    null, no call."""
    names = [n for n in side_atoms(program, side) if n not in skip]
    merged = MinedValues([MinedValue(atom=n, value=None) for n in names])
    return StageResult(
        stage=f"miner_{side}",
        status="accepted",
        teacher=fz.endpoint.name,
        model=fz.endpoint.model,
        prompt_version=fz.prompt(f"miner_{side}").ident,
        messages=[],
        output_json=miner_target(merged.values, sparse=fz.prompt(f"miner_{side}").sparse),
        output=merged,
        chart_read=chart_read,
        assembly={"calls": 0, "chunks": 0, "passages": {}},
    )


def pair_chart_read(inc: StageResult, exc: StageResult, sources: dict[str, str]) -> ChartRead | None:
    """The pair's `ChartRead` (both sides read the same sheet): reused only when neither side made
    the reading, with the documents the merged values' evidence comes from (`sources`)."""
    reads = [r.chart_read for r in (inc, exc) if r.chart_read is not None]
    if not reads:
        return None
    return reads[0].model_copy(
        update={
            "reused": all(r.reused for r in reads),
            "evidence_documents": sorted(set(sources.values())),
        }
    )


def _checked_against_sheet(mined: MinedValues, sheet: FactSheet) -> MinedValues:
    """Every value's quote must be verbatim inside one excerpt (each piece of a '...' quote): a quote
    that spans two excerpts is not verbatim in the chart, so its atom stays unresolved."""
    by_doc: dict[str, list[str]] = {}
    for e in sheet.excerpts:
        by_doc.setdefault(e.document, []).append(normalize_ws(e.text))
    values, unread = [], dict(mined.unread)
    for mv in mined.values:
        if mv.value is None and mv.bounds is None:
            values.append(mv)
            continue
        texts = by_doc.get(mined.sources.get(mv.atom, ""), [])
        pieces = [normalize_ws(p) for p in split_pieces(mv.evidence)]
        if pieces and all(any(p in t for t in texts) for p in pieces):
            values.append(mv)
        else:
            values.append(MinedValue(atom=mv.atom, value=None))
            unread[mv.atom] = (
                "not read: the evidence spans two excerpts of the fact sheet; confirm in the chart"
            )
    sources = {a: d for a, d in mined.sources.items() if a not in unread}
    return MinedValues(values, sources, mined.conflicts, unread)
