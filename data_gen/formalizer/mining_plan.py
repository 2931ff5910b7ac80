"""The value miner's calls, planned before any is made: atom chunks x passage groups, each call
within the answering model's limits (see `miner.py` for the rules). No model is needed: the budget
report, dry runs and benchmarks plan with `plan_miner_calls`, the stage with `plan_for`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from verdict.core.errors import VerdictError
from verdict.core.program import TrialProgram

from .checks import compact, quote_in_note
from .miner_prompt import check_side, miner_messages, render_atoms, side_atoms
from .passages import Passage, split_document
from .prompt_templates import stage_prompt
from .protocol import SINGLE_NOTE_ID, NoteDocument, PatientDoc

if TYPE_CHECKING:
    from .routing import SheetRoute
    from .runtime import Runtime

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
# The fewest note tokens a call must have room for, and the passes at splitting a passage again.
_MIN_NOTE_TOKENS = 16
_RESPLITS = 4


class MinerBudgetError(VerdictError):
    """A value-miner call cannot fit the model's limits, however small the chunk or passage."""


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
    route: SheetRoute | None = None,
) -> list[PlannedCall]:
    """Every call one side's mining makes, in order (passage groups, then chunks), each within
    `prompt_budget` prompt tokens (None: no limit) and `completion_budget` completion tokens.
    `names`: only these of the side's atoms (the rest reused). `route` (a fact sheet:
    `routing.SheetRoute`): when the sheet is routed (`routing.reads_whole` says no), each chunk
    reads only the excerpts routed to its atoms. No model is needed: the budget report and dry
    runs call this."""
    check_side(side)
    names = side_atoms(program, side) if names is None else names
    if not names or not documents:
        return []
    planner = MinerPlanner(
        program, side, documents, count_messages, count_text, prompt_budget, prompt_version
    )
    chunks = atom_chunks(
        program,
        names,
        completion_budget=completion_budget,
        count_text=count_text,
        max_atoms=max_atoms,
        sparse=planner.sparse,
        atoms_budget=planner.atoms_budget(),
    )
    note_budget = planner.note_budget(chunks)
    if route is not None and not route.reads_whole(note_budget):
        return planner.routed_calls(chunks, route, note_budget)
    return planner.whole_calls(chunks, note_budget)


@dataclass
class MinerPlanner:
    """The steps of `plan_miner_calls` for one side of one record under one model's limits: the
    prompt it renders, the budgets it keeps, and the calls of the whole record or of a route."""

    program: TrialProgram
    side: str
    documents: list[NoteDocument]
    count_messages: Callable[[list[dict[str, str]]], int]
    count_text: Callable[[str], int]
    prompt_budget: int | None  # None: no limit
    prompt_version: str | None = None
    by_id: dict[str, NoteDocument] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {d.id: d for d in self.documents}

    @property
    def stage(self) -> str:
        return f"miner_{self.side}"

    @property
    def sparse(self) -> bool:
        """Whether the prompt asks for sparse answers: the prompt, not the completion, bounds a chunk."""
        return stage_prompt(self.stage, self.prompt_version).sparse

    def render(self, note: str, atoms: list[str]) -> list[dict[str, str]]:
        """The messages of one call: this note, these atoms."""
        return miner_messages(self.program, note, self.side, atoms, self.prompt_version)

    def record_tokens(self) -> int:
        """The whole record as one call reads it: its documents, each under a header when several."""
        headers = HEADER_TOKENS * len(self.documents) if len(self.documents) > 1 else 0  # one note: none
        return sum(self.count_text(d.text) for d in self.documents) + headers

    def atoms_budget(self) -> int | None:
        """Sparse answers: the atom list's room, what the bare prompt leaves less the note's reserve
        (the whole record, at most half of that room), so that a chunk never crowds out the note."""
        if self.prompt_budget is None:
            return None
        bare = self.count_messages(self.render("", []))
        room = max(0, self.prompt_budget - bare - _PROMPT_MARGIN)
        return room - min(room // 2, self.record_tokens())

    def note_budget(self, chunks: list[list[str]]) -> int | None:
        """The note tokens every call has room for beside its chunk (the largest chunk's prompt
        decides; None: no limit). Refused when that leaves almost none."""
        if self.prompt_budget is None:
            return None
        frame = max(self.count_messages(self.render("", c)) for c in chunks)  # the prompt around the note
        budget = self.prompt_budget - frame - _PROMPT_MARGIN
        if budget < _MIN_NOTE_TOKENS:
            raise MinerBudgetError(
                f"{self.stage}: the prompt without the note already takes {frame} tokens of the "
                f"{self.prompt_budget}-token prompt budget; lower max_tokens or the atoms per call"
            )
        return budget

    def passages(self, documents: list[NoteDocument], note_budget: int | None) -> list[Passage]:
        """The documents cut into passages that fit the note budget, in order."""
        return [p for d in documents for p in split_document(d, note_budget, self.count_text)]

    def call(self, group: list[Passage], text: str, chunks: list[list[str]], j: int) -> PlannedCall:
        """The call that asks chunk `j` about one passage group (`text`, rendered), its prompt counted."""
        msgs = self.render(text, chunks[j - 1])
        return PlannedCall(self.stage, group, j, len(chunks), chunks[j - 1], msgs, self.count_messages(msgs))

    def calls_of(self, group: list[Passage], chunks: list[list[str]]) -> list[PlannedCall]:
        """Every chunk asked about one passage group: a call each."""
        text = note_text(group, self.by_id)
        return [self.call(group, text, chunks, j) for j in range(1, len(chunks) + 1)]

    def fits(self, calls: list[PlannedCall]) -> bool:
        """Whether every one of these calls' prompts is within the prompt budget."""
        return self.prompt_budget is None or all(c.prompt_tokens <= self.prompt_budget for c in calls)

    def whole_calls(self, chunks: list[list[str]], note_budget: int | None) -> list[PlannedCall]:
        """The whole record read by every chunk: the passage groups in order, each group's chunks."""
        groups = group_passages(
            self.passages(self.documents, note_budget), self.by_id, note_budget, self.count_text
        )
        return [c for group in groups for c in self.group_calls(group, chunks, note_budget)]

    def group_calls(
        self, group: list[Passage], chunks: list[list[str]], note_budget: int | None
    ) -> list[PlannedCall]:
        """A group's calls; when the packing's estimate was optimistic, a call per passage, and a
        passage that still overshoots split again (`resplit`)."""
        planned = self.calls_of(group, chunks)
        if not self.fits(planned) and len(group) > 1:
            planned = [c for p in group for c in self.calls_of([p], chunks)]
        if not self.fits(planned):
            planned = [c for p in group for c in self.resplit(p, chunks, note_budget)]
        return planned

    def resplit(self, passage: Passage, chunks: list[list[str]], room: int) -> list[PlannedCall]:
        """A passage whose rendered calls still overshoot: split again, each time with less room by
        what the largest prompt overshot, a few times before it is refused."""
        planned = self.calls_of([passage], chunks)
        for _ in range(_RESPLITS):
            if self.fits(planned):
                return planned
            over = max(c.prompt_tokens for c in planned) - self.prompt_budget
            room = max(_MIN_NOTE_TOKENS, room - over - _PROMPT_MARGIN)
            planned = [c for q in self.pieces(passage, room) for c in self.calls_of([q], chunks)]
        raise MinerBudgetError(
            f"{self.stage}: document '{passage.document}' does not split into passages that fit "
            f"the {self.prompt_budget}-token prompt budget"
        )

    def pieces(self, passage: Passage, room: int) -> list[Passage]:
        """A passage cut within `room` tokens, each piece a passage of its document (offsets kept)."""
        part = NoteDocument(id=passage.document, text=passage.text)
        p = passage
        return [
            Passage(p.document, p.index, p.total, p.start + q.start, p.start + q.end, q.text, sub=k)
            for k, q in enumerate(split_document(part, room, self.count_text), 1)
        ]

    def routed_calls(
        self, chunks: list[list[str]], route: SheetRoute, note_budget: int | None
    ) -> list[PlannedCall]:
        """One call per chunk and group of the documents routed to its atoms (they fit the note
        budget); a chunk nothing is routed to makes no call: its atoms stay null, unresolved."""
        calls: list[PlannedCall] = []
        for j, chunk in enumerate(chunks, 1):
            docs = route.documents_for(chunk, note_budget)
            by_id = {d.id: d for d in docs}
            for group in group_passages(
                self.passages(docs, note_budget), by_id, note_budget, self.count_text
            ):
                calls.append(self.call(group, note_text(group, by_id), chunks, j))
        return calls


def plan_for(
    fz: Runtime,
    program: TrialProgram,
    note,
    side: str,
    names: list[str] | None = None,
    route: SheetRoute | None = None,
) -> list[PlannedCall]:
    """`plan_miner_calls` with the endpoint's limits and tokenizer."""
    limits = fz.planner_limits(f"miner_{side}")
    return plan_miner_calls(program, as_documents(note), side, names=names, route=route, **limits)
