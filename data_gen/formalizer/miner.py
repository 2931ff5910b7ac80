"""The value-miner stage: a patient record + a side's atoms -> checked values with evidence.

Every call fits the answering model's limits. The side's atoms go in chunks (`atom_chunks`). The
prompt (`prompt_templates`) says how the model answers:

- sparse (v2, the default): only the atoms the text establishes, an omitted atom is null. A chunk
  is at most `MAX_ATOMS_PER_CALL` atoms whose rendered list fits the prompt budget beside the
  bare prompt and a note reserve (the whole record with its document headers, at most half of
  that room; a longer record is split into passages): the prompt binds, not the completion. A
  completion cut off at the token limit (finish_reason "length") is not repaired: its chunk is
  split in two and asked again (down to one atom), so no atom is dropped.
- dense (v1, kept for the records made with it): a line for every asked atom; at most
  `MAX_ATOMS_PER_DENSE_CALL` atoms, and no more than the completion budget holds at a worst-case
  value line, evidence quote included.

The record is split into passages that fit the prompt budget beside the largest chunk
(`passages.py`: never truncated, never across two documents), and consecutive short passages share a
call, each under its document's header. One call per passage group x chunk (`plan_miner_calls`,
which needs no model: the budget report uses it); each quote is checked against the passages of its
call (verbatim in one of them, which names its document); then the calls are merged
deterministically (`merge_findings`):

- a value found in one passage and null in the others is that value;
- the same value found twice keeps the first evidence (documents, then passages, in order);
- values that cannot both hold (true vs false, different numbers, a number outside a bound,
  disjoint bounds) are a `PassageConflict`: both values with their quotes and documents; the
  atom is null in the merge and stays unresolved (`verdict.core.policy.resolve(held_open=...)`).

A side is accepted only if every call is; a rejected call is named by its document, passage and
chunk, and the accepted calls stay in `StageResult.calls` (and in the cache).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import Field
from verdict.core.configs import StrictModel
from verdict.core.errors import VerdictError
from verdict.core.patient import Bounds, MinedValue, Value, ValueMinerOutput, value_type_problems
from verdict.core.program import TrialProgram
from verdict.core.reference import meet as meet_values  # the one rule for two records of one fact

from .cache import CachedCall
from .checks import SIDES, Check, compact, core_schema, parse_output, quote_in_note, with_atom_enum
from .passages import Passage, split_document
from .prompt_templates import stage_prompt
from .protocol import SINGLE_NOTE_ID, NoteDocument, PatientDoc, StageResult, Usage
from .value_reuse import record_key

if TYPE_CHECKING:
    from .runtime import Runtime

# A fact sheet's routing (`routing.SheetRouter`): (a chunk's atoms, its note budget in tokens, None:
# no limit) -> the documents that chunk reads.
Route = Callable[[list[str], int | None], list[NoteDocument]]

# Sparse answers: a chunk is bounded by the prompt (32 atoms of the reference corpus, ~54 Qwen2.5
# tokens each, are ~1,700 tokens) and at most half the prompt budget; dense answers by the completion.
MAX_ATOMS_PER_CALL = 32
MAX_ATOMS_PER_DENSE_CALL = 16
# The evidence allowance of one value line: a quote as long as this sentence (168 characters),
# counted with the answering model's tokenizer. The prompt asks for the shortest quote.
_SAMPLE_QUOTE = (
    "On admission she reported chest pain radiating to the left arm for 3 days; troponin I was "
    "0.04 ng/mL, creatinine 1.2 mg/dL, and she denies smoking or alcohol use."
)
# A document's header line when several share a call (`document_header`), a generous estimate.
HEADER_TOKENS = 24
# Room kept between a planned prompt and its budget (tokens at the note's edges may merge).
_PROMPT_MARGIN = 8


BUDGET = "budget"  # the rejection reason of a pass that cannot be asked within the model's limits


class MinerBudgetError(VerdictError):
    """A value-miner call cannot fit the model's limits, however small the chunk or passage."""


# ---- prompts and checks --------------------------------------------------------------------------
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


def asked_atoms(messages: list[dict[str, str]]) -> list[str]:
    """The atoms a value-miner request asks, read back from its atom list (`render_atoms`: one JSON
    object per line after the note), in order: a sparse target names only the established ones."""
    names = []
    for line in reversed(messages[-1]["content"].splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            break
        if not (isinstance(row, dict) and "name" in row and "kind" in row):
            break
        names.append(row["name"])
    return names[::-1]


def miner_messages(
    program: TrialProgram, note: str, side: str, names: list[str], version: str | None = None
) -> list[dict[str, str]]:
    """The value-miner request of one call (`version` None: the stage's default prompt)."""
    return stage_prompt(f"miner_{side}", version).render(
        NOTE=note.strip(), ATOMS=render_atoms(program, names)
    )


def miner_target(values: list[MinedValue], *, sparse: bool) -> str:
    """The compact JSON a student emits for these values: sparse, only the established ones (a null
    line is left out: it is null by definition); dense, every value (nulls without evidence)."""
    return compact(
        {
            "values": [
                mv.model_dump(mode="json", exclude_defaults=True) | {"value": mv.value}
                for mv in values
                if not sparse or mv.value is not None or mv.bounds is not None
            ]
        }
    )


def check_miner_output(
    content: str | None,
    finish_reason: str | None,
    program: TrialProgram,
    names: list[str],
    note: str | list[str],
    *,
    max_tokens: int,
    sparse: bool = False,
) -> Check:
    """JSON -> ValueMinerOutput schema -> only asked atoms, each once, typed, with verbatim evidence
    (quoted from `note`: the passage the call read, or one of its passages, a quote never spanning
    two); dense (`sparse` False) answers must also give every asked atom. Output: one value per
    asked atom in the prompt's atom order, an omitted atom null; `output_json` the canonical
    training target (`miner_target`)."""
    texts = [note] if isinstance(note, str) else note
    out, problems = parse_output(content, finish_reason, max_tokens, ValueMinerOutput)
    if out is None:
        return Check(problems)
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
        problems += [
            ("type", f"{where}: {p}") for p in value_type_problems(table[mv.atom].domain, mv.value, mv.bounds)
        ]
        if mv.value is not None and mv.bounds is not None:
            problems.append(("type", f"{where}: give a value or bounds, not both"))
        has_value = mv.value is not None or mv.bounds is not None
        if has_value and not mv.evidence.strip():
            problems.append(("evidence", f"{where}: a value needs an evidence quote from the note"))
        elif mv.evidence.strip() and not any(quote_in_note(mv.evidence, t) for t in texts):
            # the message names the atom, never the quote: problems end up in logs and records
            problems.append(("evidence", f"{where}: evidence is not a verbatim quote from the note"))
    missing = [n for n in names if n not in got]
    if missing and not sparse:
        problems.append(("coverage", f"atoms missing from the output: {', '.join(missing)}"))
    ordered = [got.get(n) or MinedValue(atom=n, value=None) for n in names]
    return Check(problems, ordered, miner_target(ordered, sparse=sparse))


# ---- planning: atom chunks x passages ------------------------------------------------------------
def value_line_tokens(program: TrialProgram, name: str, count_text: Callable[[str], int]) -> int:
    """Worst-case completion tokens of one atom's value line: the longer of a value and a bounds
    answer, with the evidence allowance, and the separating comma."""
    domain = program.atom_table()[name].domain
    if domain == "bool":
        line = {"atom": name, "value": False, "evidence": ""}
    else:
        line = {
            "atom": name,
            "value": None,
            "bounds": {"lo": -123456.789, "hi": -123456.789, "lo_strict": False, "hi_strict": False},
            "evidence": "",
        }
    return count_text(compact(line) + ",") + count_text(_SAMPLE_QUOTE)


def atom_chunks(
    program: TrialProgram,
    names: list[str],
    *,
    completion_budget: int,
    count_text: Callable[[str], int],
    max_atoms: int | None = None,
    sparse: bool = False,
    atoms_budget: int | None = None,
) -> list[list[str]]:
    """The atoms in prompt order, in consecutive chunks of at most `max_atoms` (default by the answer
    form). Dense: the chunk's worst-case answers fit `completion_budget` tokens. Sparse: its rendered
    atom list takes at most `atoms_budget` tokens (None: no limit) and one worst-case line fits the
    completion (a longer answer is split by `mine_values`). Every atom is in exactly one chunk."""
    max_atoms = max_atoms or (MAX_ATOMS_PER_CALL if sparse else MAX_ATOMS_PER_DENSE_CALL)
    envelope = count_text(compact({"values": []}))
    room = atoms_budget
    chunks: list[list[str]] = []
    used = listed = 0
    for name in names:
        need = value_line_tokens(program, name, count_text)
        rows = count_text(render_atoms(program, [name])) + 1 if sparse else 0
        fits = (room is None or listed + rows <= room) if sparse else used + need <= completion_budget
        if chunks and len(chunks[-1]) < max_atoms and fits:
            chunks[-1].append(name)
            used += need
            listed += rows
        else:
            listed = rows
            if envelope + need > completion_budget:
                raise MinerBudgetError(
                    f"atom '{name}': one value line may need {envelope + need} completion "
                    f"tokens, more than the stage's max_tokens ({completion_budget})"
                )
            chunks.append([name])
            used = envelope + need
    return chunks


@dataclass
class PlannedCall:
    """One value-miner call: a chunk of atoms asked about one passage, or about several short
    passages of consecutive documents, each under its own document header."""

    stage: str
    passages: list[Passage]
    chunk: int  # 1-based
    chunks: int
    atoms: list[str]
    messages: list[dict[str, str]]
    prompt_tokens: int
    part: str = ""  # a half of a chunk whose sparse answer was cut off: ".1", ".2", ".1.2", ...

    @property
    def call_id(self) -> str:
        """Stable within a side: `DOC#PASSAGE/cCHUNK`, or `FIRST..LAST/cCHUNK` for several passages
        (a re-asked half of a chunk: `.../cCHUNK.1`)."""
        first, last = self.passages[0], self.passages[-1]
        where = first.id if len(self.passages) == 1 else f"{first.id}..{last.id}"
        return f"{where}/c{self.chunk}{self.part}"

    def halves(
        self, render: Callable[[list[str]], list[dict[str, str]]], count_messages
    ) -> list[PlannedCall]:
        """This call's atoms in two calls over the same passages (`render`: atoms -> messages)."""
        mid = len(self.atoms) // 2
        out = []
        for k, atoms in enumerate((self.atoms[:mid], self.atoms[mid:]), 1):
            msgs = render(atoms)
            out.append(
                PlannedCall(
                    self.stage,
                    self.passages,
                    self.chunk,
                    self.chunks,
                    atoms,
                    msgs,
                    count_messages(msgs),
                    part=f"{self.part}.{k}",
                )
            )
        return out

    @property
    def label(self) -> str:
        if len(self.passages) == 1:
            where = self.passages[0].label
        else:
            where = "documents " + ", ".join(f"'{p.document}'" for p in self.passages)
        return f"{where}, atoms chunk {self.chunk}/{self.chunks}"

    @property
    def texts(self) -> list[str]:
        """The passages' texts: an evidence quote must be verbatim in one of them."""
        return [p.text for p in self.passages]

    def source_of(self, quote: str) -> str:
        """The document of the first passage of this call the quote is verbatim in."""
        return next(
            (p.document for p in self.passages if quote_in_note(quote, p.text)), self.passages[0].document
        )


def as_documents(note: PatientDoc | NoteDocument | str | list[NoteDocument]) -> list[NoteDocument]:
    if isinstance(note, PatientDoc):
        return note.note_documents()
    if isinstance(note, NoteDocument):
        return [note]
    if isinstance(note, str):
        return [NoteDocument(id=SINGLE_NOTE_ID, text=note)]
    return list(note)


def document_header(doc: NoteDocument, passage: Passage) -> str:
    """The line above a passage when one call reads several: which document (and where in it)."""
    info = [x for x in (doc.kind, doc.date) if x]
    if passage.total > 1:
        info.append(f"passage {passage.index} of {passage.total}")
    return f"[document {doc.id}" + (f" ({', '.join(info)})" if info else "") + "]"


def note_text(passages: list[Passage], docs: dict[str, NoteDocument]) -> str:
    """What the prompt's note slot holds: one passage as is (the single-note prompt), several each
    under its document header."""
    if len(passages) == 1:
        return passages[0].text
    return "\n\n".join(f"{document_header(docs[p.document], p)}\n{p.text.strip()}" for p in passages)


def group_passages(
    passages: list[Passage],
    docs: dict[str, NoteDocument],
    budget: int | None,
    count_text: Callable[[str], int],
) -> list[list[Passage]]:
    """Consecutive passages packed into one call while their note text fits `budget` (None: all)."""
    groups: list[list[Passage]] = []
    for p in passages:
        if groups and (budget is None or count_text(note_text(groups[-1] + [p], docs)) <= budget):
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def plan_miner_calls(
    program: TrialProgram,
    documents: list[NoteDocument],
    side: str,
    *,
    count_messages: Callable[[list[dict[str, str]]], int],
    count_text: Callable[[str], int],
    prompt_budget: int | None,
    completion_budget: int,
    prompt_version: str | None = None,
    max_atoms: int | None = None,
    names: list[str] | None = None,
    route: Route | None = None,
) -> list[PlannedCall]:
    """Every call one side's mining makes, in order (passage groups, then chunks), each within
    `prompt_budget` prompt tokens (None: no limit) and `completion_budget` completion tokens.
    `names`: only these of the side's atoms (the rest reused). `route` (a fact sheet too large for
    one call: `routing.SheetRouter`): each chunk reads only what it routes to its atoms. No model is
    needed: the budget report and dry runs call this."""
    if side not in SIDES:
        raise ValueError(f"side must be inclusion or exclusion (got '{side}')")
    stage = f"miner_{side}"
    names = side_atoms(program, side) if names is None else names
    if not names or not documents:
        return []
    sparse = stage_prompt(stage, prompt_version).sparse
    docs = {d.id: d for d in documents}

    def render(text: str, chunk: list[str]) -> list[dict[str, str]]:
        return miner_messages(program, text, side, chunk, prompt_version)

    atoms_budget = None  # sparse: what the bare prompt leaves, less the note's reserve
    if prompt_budget is not None:
        room = max(0, prompt_budget - count_messages(render("", [])) - _PROMPT_MARGIN)
        headers = HEADER_TOKENS * len(documents) if len(documents) > 1 else 0  # one note: no header
        record = sum(count_text(d.text) for d in documents) + headers
        atoms_budget = room - min(room // 2, record)
        if route is not None and record <= room // 2:
            route = None  # the whole record fits beside the atoms: every chunk reads all of it
    chunks = atom_chunks(
        program,
        names,
        completion_budget=completion_budget,
        count_text=count_text,
        max_atoms=max_atoms,
        sparse=sparse,
        atoms_budget=atoms_budget,
    )

    def calls_of(group: list[Passage]) -> list[PlannedCall]:
        text = note_text(group, docs)
        return [
            PlannedCall(stage, group, j, len(chunks), c, msgs, count_messages(msgs))
            for j, c in enumerate(chunks, 1)
            for msgs in [render(text, c)]
        ]

    def fits(calls: list[PlannedCall]) -> bool:
        return prompt_budget is None or all(c.prompt_tokens <= prompt_budget for c in calls)

    note_budget = None
    if prompt_budget is not None:
        frame = max(count_messages(render("", c)) for c in chunks)  # the prompt around the note
        note_budget = prompt_budget - frame - _PROMPT_MARGIN
        if note_budget < 16:
            raise MinerBudgetError(
                f"{stage}: the prompt without the note already takes {frame} tokens of the "
                f"{prompt_budget}-token prompt budget; lower max_tokens or the atoms per call"
            )
    if route is not None:
        return _routed_calls(program, chunks, side, route, note_budget, render, count_messages, count_text)
    calls: list[PlannedCall] = []
    for group in group_passages(
        [p for d in documents for p in split_document(d, note_budget, count_text)],
        docs,
        note_budget,
        count_text,
    ):
        planned = calls_of(group)
        if not fits(planned) and len(group) > 1:  # the packing's estimate was optimistic: one call each
            planned = [c for p in group for c in calls_of([p])]
        if not fits(planned):
            planned = _resplit(group, calls_of, fits, note_budget, count_text, stage, prompt_budget)
        calls += planned
    return calls


def _routed_calls(program, chunks, side, route, note_budget, render, count_messages, count_text):
    """One call per chunk over the documents routed to its atoms (they fit the note budget; a
    chunk nothing is routed to makes no call: its atoms stay null, unresolved)."""
    stage = f"miner_{side}"
    calls: list[PlannedCall] = []
    for j, chunk in enumerate(chunks, 1):
        docs = route(chunk, note_budget)
        if not docs:
            continue
        by_id = {d.id: d for d in docs}
        passages = [p for d in docs for p in split_document(d, note_budget, count_text)]
        for group in group_passages(passages, by_id, note_budget, count_text):
            msgs = render(note_text(group, by_id), chunk)
            calls.append(PlannedCall(stage, group, j, len(chunks), chunk, msgs, count_messages(msgs)))
    return calls


def _resplit(group, calls_of, fits, budget, count_text, stage, prompt_budget) -> list[PlannedCall]:
    """A passage whose rendered calls still overshoot: split its document again with less room."""
    out: list[PlannedCall] = []
    for p in group:
        planned = calls_of([p])
        room = budget
        for _ in range(4):
            if fits(planned):
                break
            over = max(c.prompt_tokens for c in planned) - prompt_budget
            room = max(16, room - over - _PROMPT_MARGIN)
            part = NoteDocument(id=p.document, text=p.text)
            pieces = [
                Passage(p.document, p.index, p.total, p.start + q.start, p.start + q.end, q.text, sub=k)
                for k, q in enumerate(split_document(part, room, count_text), 1)
            ]
            planned = [c for q in pieces for c in calls_of([q])]
        else:
            raise MinerBudgetError(
                f"{stage}: document '{p.document}' does not split into passages that fit "
                f"the {prompt_budget}-token prompt budget"
            )
        out += planned
    return out


def plan_for(
    fz: Runtime,
    program: TrialProgram,
    note,
    side: str,
    names: list[str] | None = None,
    route: Route | None = None,
) -> list[PlannedCall]:
    """`plan_miner_calls` with the endpoint's limits and tokenizer."""
    stage = f"miner_{side}"
    return plan_miner_calls(
        program,
        as_documents(note),
        side,
        count_messages=fz.tokens.count_messages,
        count_text=fz.tokens.count_text,
        prompt_budget=fz.prompt_budget(stage),
        completion_budget=fz.endpoint.max_tokens.for_stage(stage),
        prompt_version=fz.prompts.get(stage),
        names=names,
        route=route,
    )


# ---- merging passages (and sides) ----------------------------------------------------------------
class Finding(StrictModel):
    """One value as one call found it."""

    value: Value | None = None
    bounds: Bounds | None = None
    evidence: str
    document: str = Field(description="id of the document the evidence quotes")
    passage: str = Field(description="the call that found it: DOC#PASSAGE/cCHUNK")

    def shown(self, atom: str) -> str:
        """The value as a rationale states it: `atom >= 5` for bounds, else the JSON value."""
        return self.bounds.text(atom) if self.bounds is not None else json.dumps(self.value)


class PassageConflict(StrictModel):
    """Values for one atom that cannot both hold: the atom is left unresolved."""

    atom: str
    side: str = Field(description="inclusion, exclusion, or 'both' (the two sides' merges disagree)")
    findings: list[Finding] = Field(min_length=2, description="each distinct value with its first quote")

    def note(self) -> str:
        """The unresolved atom's note: values and documents, never the quotes."""
        said = "; ".join(f"document '{f.document}' gives {f.shown(self.atom)}" for f in self.findings)
        return f"extraction conflict, confirm in the chart: {said}"


@dataclass
class MinedValues:
    """A side's merged values (one per asked atom, prompt order; iterating yields them), the
    document each value's evidence comes from, and the conflicts between passages."""

    values: list[MinedValue]
    sources: dict[str, str] = field(default_factory=dict)
    conflicts: list[PassageConflict] = field(default_factory=list)
    unread: dict[str, str] = field(default_factory=dict)  # atom -> why no call could read it

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def held_open(self) -> dict[str, str]:
        """atom -> note, for `verdict.core.policy.resolve(held_open=...)`: the atoms that stay
        unresolved whatever the policy says (values that contradict, and atoms a call that failed
        validation asked: the chart may hold them, so a default must not stand in for them)."""
        return {**self.unread, **{c.atom: c.note() for c in self.conflicts}}


def _compatible(a: Finding, b: Finding) -> Finding | None:
    """What both findings say, or None if they cannot both hold: the import's rule for two records of
    one chart fact (`verdict.core.reference`), keeping the document of the quote that stays."""
    mv_a = MinedValue(atom="x", value=a.value, bounds=a.bounds, evidence=a.evidence)
    mv_b = MinedValue(atom="x", value=b.value, bounds=b.bounds, evidence=b.evidence)
    met = meet_values(mv_a, mv_b)
    if met is None:
        return None
    keep = b if met is mv_b else a
    return keep.model_copy(update={"value": met.value, "bounds": met.bounds})


def merge_findings(names: list[str], findings: dict[str, list[Finding]], side: str) -> MinedValues:
    """One value per atom from the calls' findings (each atom's list in plan order)."""
    values, sources, conflicts = [], {}, []
    for name in names:
        found = findings.get(name, [])
        if not found:
            values.append(MinedValue(atom=name, value=None))
            continue
        kept, distinct, clash = found[0], [found[0]], False
        for f in found[1:]:
            if not any((f.value, f.bounds) == (d.value, d.bounds) for d in distinct):
                distinct.append(f)
            merged = None if clash else _compatible(kept, f)
            if merged is None:
                clash = True
            else:
                kept = merged
        if clash:
            conflicts.append(PassageConflict(atom=name, side=side, findings=distinct))
            values.append(MinedValue(atom=name, value=None))
        else:
            values.append(MinedValue(atom=name, value=kept.value, bounds=kept.bounds, evidence=kept.evidence))
            sources[name] = kept.document
    return MinedValues(values, sources, conflicts)


def _findings_of(values, call: PlannedCall) -> dict[str, list[Finding]]:
    """A call's non-null values, each with the document its quote is from."""
    return {
        mv.atom: [
            Finding(
                value=mv.value,
                bounds=mv.bounds,
                evidence=mv.evidence,
                document=call.source_of(mv.evidence),
                passage=call.call_id,
            )
        ]
        for mv in values
        if mv.value is not None or mv.bounds is not None
    }


def merge_sides(inclusion: MinedValues, exclusion: MinedValues) -> MinedValues:
    """The two sides' merges as one (an atom both sides use: the same rule as between passages):
    what `resolve` takes, with every conflict of either side."""
    findings: dict[str, list[Finding]] = {}
    names: list[str] = []
    for mv_side in (inclusion, exclusion):
        for mv in mv_side.values:
            if mv.atom not in names:
                names.append(mv.atom)
            if mv.value is not None or mv.bounds is not None:
                doc = mv_side.sources.get(mv.atom, SINGLE_NOTE_ID)
                findings.setdefault(mv.atom, []).append(
                    Finding(value=mv.value, bounds=mv.bounds, evidence=mv.evidence, document=doc, passage=doc)
                )
    merged = merge_findings(names, findings, "both")
    conflicts = inclusion.conflicts + exclusion.conflicts
    taken = {c.atom for c in conflicts}
    conflicts += [c for c in merged.conflicts if c.atom not in taken]
    unread = {a: why for a, why in {**inclusion.unread, **exclusion.unread}.items() if a not in taken}
    taken |= set(unread)  # an atom one side's failed call asked stays unresolved for both
    values = [MinedValue(atom=mv.atom, value=None) if mv.atom in taken else mv for mv in merged.values]
    sources = {a: d for a, d in merged.sources.items() if a not in taken}
    return MinedValues(values, sources, conflicts, unread)


# ---- the stage ------------------------------------------------------------------------------------
async def mine_values(
    fz: Runtime,
    program: TrialProgram,
    note: PatientDoc | NoteDocument | str | list,
    side: str,
    *,
    data_class: str | None = None,
    skip: Collection[str] = (),
    route: Route | None = None,
) -> StageResult:
    """Patient record + the side's atoms -> checked, merged values with evidence: one call per
    passage x atom chunk (`plan_for`). `output` is a `MinedValues`; `calls` each call's result.
    `skip`: atoms decided without the miner (coded FHIR facts): never asked, never in `output`.
    `route`: the record is a large fact sheet, each chunk reads what is routed to it."""
    if side not in SIDES:
        raise ValueError(f"side must be inclusion or exclusion (got '{side}')")
    pid = note.patient_id if isinstance(note, PatientDoc) else "-"
    dclass = data_class or (note.data_class if isinstance(note, PatientDoc) else "private")
    stage = f"miner_{side}"
    names = [n for n in side_atoms(program, side) if n not in skip]
    base = dict(
        stage=stage, teacher=fz.endpoint.name, model=fz.endpoint.model, prompt_version=fz.prompt(stage).ident
    )
    if not names:  # nothing to ask: no call, an empty (trivially valid) answer
        docs = as_documents(note)
        return StageResult(
            **base,
            status="accepted",
            messages=miner_messages(program, docs[0].text, side, [], fz.prompts.get(stage)),
            output_json=compact({"values": []}),
            output=MinedValues([]),
        )
    max_tokens = fz.endpoint.max_tokens.for_stage(stage)
    docs = as_documents(note)
    by_id = {d.id: d for d in docs}
    sparse = fz.prompt(stage).sparse

    async def one(call: PlannedCall) -> list[tuple[PlannedCall, StageResult, bool]]:
        """The call's (call, result, cut off) triples: one, or, when a sparse answer was cut off at the
        token limit, that one and the results of its two halves, asked again (never dropped)."""
        schema = with_atom_enum(core_schema("value-miner"), call.atoms)
        splittable = sparse and len(call.atoms) > 1

        def validate(c: CachedCall) -> Check:
            return check_miner_output(
                c.content,
                c.finish_reason,
                program,
                call.atoms,
                call.texts,
                max_tokens=max_tokens,
                sparse=sparse,
            )

        res = await fz.run_stage(
            stage,
            call.messages,
            schema,
            "value_miner_output",
            validate,
            patient_text=True,
            data_class=dclass,
            sensitive=tuple(call.texts),
            ids=f"trial={program.trial_id} patient={pid} call={call.call_id}",
            no_repair=("truncated",) if splittable else (),
        )
        res = res.model_copy(update={"item": call.call_id})
        if not (splittable and res.reason == "truncated"):
            return [(call, res, False)]
        text = note_text(call.passages, by_id)
        halves = await asyncio.to_thread(
            call.halves,
            lambda atoms: miner_messages(program, text, side, atoms, fz.prompts.get(stage)),
            fz.tokens.count_messages,
        )
        asked = await asyncio.gather(*(one(h) for h in halves))
        return [(call, res, True), *(x for part in asked for x in part)]

    async def ask(ask_names: list[str]) -> MiningRound:
        """Mine these atoms: the calls, their results, and the findings (or the rejected result)."""
        if not ask_names:
            return MiningRound()
        try:
            plan = await asyncio.to_thread(
                plan_for, fz, program, note, side, ask_names, route
            )  # exact counts: off the loop
        except MinerBudgetError as e:  # no call can fit the model's limits: rejected, no call made
            return MiningRound(
                rejected=StageResult(
                    **base,
                    status="rejected",
                    reason=BUDGET,
                    problems=[e.summary],
                    messages=miner_messages(program, docs[0].text, side, ask_names, fz.prompts.get(stage)),
                )
            )
        answered = [x for out in await asyncio.gather(*(one(c) for c in plan)) for x in out]
        cut = [r for _, r, was_cut in answered if was_cut]  # re-asked in halves: cost, not a failure
        plan = [c for c, _, was_cut in answered if not was_cut]
        results = [r for _, r, was_cut in answered if not was_cut]
        rejected = [(c, r) for c, r in zip(plan, results) if not r.accepted]
        # Nothing read: the side is rejected (502 in the service). No call at all (a routed sheet
        # with nothing that bears on these atoms) is no finding, not a failure: the atoms stay null.
        if results and len(rejected) == len(results):
            usage = Usage()
            for r in results + cut:
                usage = usage.add(r.usage)
            return MiningRound(
                plan,
                results,
                cut=cut,
                rejected=StageResult(
                    **base,
                    status="rejected",
                    reason=rejected[0][1].reason,
                    problems=[f"{c.label}: {p}" for c, r in rejected for p in r.problems],
                    messages=results[0].messages,
                    attempts=[a for r in results for a in r.attempts],
                    usage=usage,
                    calls=results,
                    assembly=_assembly(plan, None),
                ),
            )
        # One call that failed validation (after its repair) does not throw the others away: its
        # atoms stay unresolved, each with the reason (ids only), and the rest of the side stands.
        found: dict[str, list[Finding]] = {}
        unread: dict[str, str] = {}
        for c, r in zip(plan, results):
            if not r.accepted:
                for atom in c.atoms:
                    unread.setdefault(
                        atom,
                        f"not read: the value miner's answer for {c.label} failed validation "
                        f"after one repair ({r.reason})",
                    )
                continue
            for atom, fs in _findings_of(r.output, c).items():
                found.setdefault(atom, []).extend(fs)
        return MiningRound(
            plan,
            results,
            findings={a: f for a, f in found.items() if a not in unread},
            unread=unread,
            cut=cut,
        )

    # Values of this record another trial already mined (or is mining) are reused (value_reuse.py).
    reuse = fz.value_reuse
    findings: dict[str, list[Finding]] = {}
    rounds: list[MiningRound] = []
    reused = 0
    if reuse is None:
        rounds.append(await ask(names))
    else:
        table = program.atom_table()
        rkey = record_key(docs, stage, fz.prompt(stage).ident, fz.endpoint.model)
        found, waiting, claimed = reuse.claim(rkey, [table[n] for n in names])
        findings.update(found)
        reused += len(found)
        if claimed:
            rounds.append(await reuse.start(rkey, claimed, ask([a.name for a in claimed])).join())
        again: list[str] = []  # atoms whose shared mining failed: asked by this trial itself
        for shared in {id(s): s for s in waiting.values()}.values():
            mine = [n for n, s in waiting.items() if s is shared]
            try:
                other = await shared.join()
            except Exception:  # noqa: BLE001 - another trial's failure is not this trial's: ask again
                other = None
            if other is None or other.rejected is not None:
                again += mine
            else:
                again += [
                    n for n in mine if n in other.unread
                ]  # a shared call failed: this trial asks itself
                findings.update({n: other.findings.get(n, []) for n in mine if n not in other.unread})
                reused += len([n for n in mine if n not in other.unread])
        if again and not (rounds and rounds[-1].rejected is not None):
            rounds.append(await ask([n for n in names if n in again]))
    unread: dict[str, str] = {}
    for r in rounds:
        if r.rejected is not None:
            return r.rejected
        findings.update(r.findings)
        unread.update(r.unread)
    plan = [c for r in rounds for c in r.plan]
    results = [x for r in rounds for x in r.results]
    cut = [x for r in rounds for x in r.cut]
    merged = merge_findings(names, findings, side)
    merged.unread = {a: why for a, why in unread.items() if a not in findings}
    usage = Usage()
    for r in results + cut:
        usage = usage.add(r.usage)
    return StageResult(
        **base,
        status="accepted",
        messages=results[0].messages
        if results
        else miner_messages(program, docs[0].text, side, names, fz.prompts.get(stage)),
        output_json=miner_target(merged.values, sparse=sparse),
        output=merged,
        attempts=[a for r in cut + results for a in r.attempts],
        usage=usage,
        calls=results,
        assembly={**_assembly(plan, merged), "reused_atoms": reused, "cut_off": [r.item for r in cut]},
    )


@dataclass
class MiningRound:
    """What one `ask` of a side's mining made: calls, results, findings per atom, or the rejection."""

    plan: list[PlannedCall] = field(default_factory=list)
    results: list[StageResult] = field(default_factory=list)
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    rejected: StageResult | None = None
    unread: dict[str, str] = field(default_factory=dict)  # atoms of calls that failed validation
    cut: list[StageResult] = field(default_factory=list)  # sparse answers cut off, re-asked in halves


def _assembly(plan: list[PlannedCall], merged: MinedValues | None) -> dict:
    """What the merge did, in ids only (no patient text): calls, passages per document, conflicts."""
    docs: dict[str, int] = {}
    for c in plan:
        for p in c.passages:
            docs[p.document] = p.total
    out = {"calls": len(plan), "chunks": plan[0].chunks if plan else 0, "passages": docs}
    if merged is not None:
        out["conflicts"] = [c.atom for c in merged.conflicts]
        out["unread"] = sorted(merged.unread)
    return out
