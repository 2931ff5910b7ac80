"""Routing a patient's fact sheet to a trial's atoms (issue 23: a pair's cost that does not grow with
the chart).

The reader keeps every statement of the chart that bears on eligibility, so a long chart makes a
long fact sheet, and mining every atom chunk against all of it would make a pair's cost grow with
the chart again. When the sheet is larger than one miner call can read, each atom chunk reads only
the excerpts that bear most on its atoms, within that call's budget:

- an excerpt's words are its text and the terms the reader wrote for it (the reader knows
  medicine: "Hgb 9.8" gets "hemoglobin, anemia"); an atom's words are its name, definition and
  unit, lower-cased and cut to a short stem so that "diabetic" meets "diabetes";
- an excerpt scores, for an atom, the inverse-document-frequency weight (over the sheet) of the
  words they share;
- the chunk's atoms take turns picking their best remaining excerpt until the budget is full, so
  every atom gets its best evidence before any atom gets its fifth.

A sheet of at most `route_above_tokens`, or one that fits a call's budget, is read whole by every
chunk (no routing: small charts and single notes are unchanged); `reads_whole` is the one place
that rule is decided. Routing never invents or alters text: a routed document holds whole excerpts
of the sheet, so every quote stays verbatim in the chart. An excerpt no atom of a chunk shares a
word with is not read by that chunk: its atoms come back null (unresolved), never false by
themselves, as for any fact the reading did not establish.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .mining_plan import HEADER_TOKENS
from .protocol import NoteDocument

if TYPE_CHECKING:
    from verdict.core.program import TrialProgram

    from .reader import Excerpt

_WORD = re.compile(r"[a-z][a-z0-9]+|[0-9]+[a-z]+[a-z0-9]*")
_STEM = 6
# Words every atom or excerpt uses: they say nothing about which excerpt bears on which atom.
_STOP = frozenset(
    """about above after again against all also and any are been before being below between both but
    can could did does doing down during each few for from further had has have having her here hers
    him his how into its itself more most not now off once only other our out over own same she
    should some such than that the their them then there these they this those through too under
    until very was were what when where which while who whom why will with within would you your
    patient patients history current currently known value values recorded qualified has_finding
    finding presence present absent years year months month days day time an as at be by do if in is it
    no of on or so to up we""".split()
)

# Words of the parser's atom names that say how, not what ("patient_has_diagnosis_of_X").
_NAME_STOP = frozenset("of in at on to by is has had diagnosis diagnosed the any prior now".split())


# The few words every trial asks about that a chart says otherwise ("a 58-year-old woman": age, sex).
_AGE = re.compile(r"\b\d+\s*-?\s*(?:years?|yrs?|y)[\s-]*old\b|\b\d+\s*(?:yo|y/o)\b|\bage[ds]?\b")
_ALIASES = {
    "woman": "female",
    "women": "female",
    "lady": "female",
    "girl": "female",
    "man": "male",
    "men": "male",
    "gentleman": "male",
    "boy": "male",
}


def stems(text: str) -> set[str]:
    """The words of a text as routing compares them: lower case, stop words out, cut to a stem
    (an age in any spelling is 'age'; 'woman' is 'female')."""
    low = text.lower().replace("_", " ")
    out = {"age"} if _AGE.search(low) else set()
    for w in _WORD.findall(low):
        if w not in _STOP:
            out.add(_ALIASES.get(w, w)[:_STEM])
    return out


def atom_term(name: str) -> str:
    """What an atom is about, in a few words of its name (the recorded reader's terms): the words
    of the name before any qualifier, stop words out, e.g. `patient_has_finding_of_angina_decubitus`
    -> 'angina decubitus'."""
    words = [
        w for w in name.split("@@")[0].lower().split("_") if w and w not in _STOP and w not in _NAME_STOP
    ]
    return " ".join(words[:5])


def atom_stems(program: TrialProgram, name: str) -> set[str]:
    a = program.atom_table()[name]
    return stems(" ".join(x for x in (a.name.replace("@@", " "), a.definition, a.unit or "") if x))


@dataclass
class SheetRouter:
    """The excerpts of one fact sheet, indexed once (their words and token counts), and the routed
    documents of any chunk of atoms."""

    excerpts: Sequence[Excerpt]
    tokens: list[int]  # each excerpt's text, in tokens (with its blank-line separator)
    words: list[set[str]]
    idf: dict[str, float]

    @classmethod
    def build(cls, excerpts: Sequence[Excerpt], count_text: Callable[[str], int]) -> SheetRouter:
        words = [stems(e.text) | {w for t in e.terms for w in stems(t)} for e in excerpts]
        df: dict[str, int] = {}
        for ws in words:
            for w in ws:
                df[w] = df.get(w, 0) + 1
        n = len(excerpts)
        idf = {w: math.log(1 + n / k) for w, k in df.items()}
        return cls(list(excerpts), [count_text(e.text) + 1 for e in excerpts], words, idf)

    def total_tokens(self) -> int:
        """The whole sheet as one call reads it: its excerpts, each document under a header when
        there are several (one document: none), as the planner measures a record."""
        docs = len({e.document for e in self.excerpts})
        return sum(self.tokens) + (HEADER_TOKENS * docs if docs > 1 else 0)

    def ranked(self, query: set[str]) -> list[int]:
        """Excerpt indexes sharing a word with `query`, best first (ties: chart order)."""
        scored = []
        for i, ws in enumerate(self.words):
            # fsum: a set's order follows the process's string hashes, and a plain float sum in
            # that order broke ties differently from run to run (the same chart, other excerpts)
            s = math.fsum(self.idf[w] for w in query & ws)
            if s > 0:
                scored.append((-s, i))
        return [i for _, i in sorted(scored)]

    def pick(self, program: TrialProgram, names: list[str], budget: int) -> list[int]:
        """The excerpts a chunk of atoms reads of a routed sheet (`reads_whole` decides which
        sheets are): the atoms take turns taking their best remaining excerpt while the budget
        (tokens of note text) holds, document headers counted; chart order."""
        lists = [self.ranked(atom_stems(program, n)) for n in names]
        chosen: set[int] = set()
        docs: set[str] = set()
        used = 0
        depth = 0
        while any(depth < len(lst) for lst in lists):
            for lst in lists:
                if depth >= len(lst) or lst[depth] in chosen:
                    continue
                i = lst[depth]
                doc = self.excerpts[i].document
                cost = self.tokens[i] + (0 if doc in docs else HEADER_TOKENS)
                if used + cost <= budget or not chosen:  # the best excerpt, however long, is read
                    chosen.add(i)
                    docs.add(doc)
                    used += cost
            depth += 1
        return sorted(chosen)

    def documents(self, chosen: list[int]) -> list[NoteDocument]:
        """The chosen excerpts as documents, in the fact sheet's own layout (`excerpt_documents`)."""
        return excerpt_documents([self.excerpts[i] for i in chosen])


def reads_whole(sheet_tokens: int, *, route_above_tokens: int, call_budget: int) -> bool:
    """The routing rule, decided here only: every atom chunk reads the whole fact sheet when it is
    at most `route_above_tokens` (routing would not pay) or fits one call's note budget
    (`call_budget`); a larger sheet is routed, each chunk reading the excerpts that bear on its atoms."""
    return sheet_tokens <= route_above_tokens or sheet_tokens <= call_budget


@dataclass
class SheetRoute:
    """One trial program's routing of one fact sheet (`ChartReading`'s two limits): whether the
    miner's calls read it whole (`reads_whole`), else what each atom chunk reads (`documents_for`)."""

    program: TrialProgram
    router: SheetRouter
    route_above_tokens: int
    route_tokens: int  # a call's note budget when the model has no limits
    routed: list[bool] = field(default_factory=list)  # per routed call: it read less than the sheet

    def call_budget(self, note_budget: int | None) -> int:
        """The sheet tokens one call reads: its note budget, or `route_tokens` with no limits (None)."""
        return self.route_tokens if note_budget is None else note_budget

    def reads_whole(self, note_budget: int | None) -> bool:
        """Whether every chunk reads the whole sheet, by the one rule (`reads_whole`)."""
        return reads_whole(
            self.router.total_tokens(),
            route_above_tokens=self.route_above_tokens,
            call_budget=self.call_budget(note_budget),
        )

    def documents_for(self, names: list[str], note_budget: int | None) -> list[NoteDocument]:
        """What a chunk of these atoms reads of a routed sheet, noting whether it is less than all."""
        chosen = self.router.pick(self.program, names, self.call_budget(note_budget))
        self.routed.append(len(chosen) < len(self.router.excerpts))
        return self.router.documents(chosen)


def excerpt_documents(excerpts: Sequence[Excerpt]) -> list[NoteDocument]:
    """Excerpts as documents: one per source document, its excerpts in the given (chart) order,
    separated by blank lines."""
    out: dict[str, list[Excerpt]] = {}
    for e in excerpts:
        out.setdefault(e.document, []).append(e)
    return [
        NoteDocument(id=d, text="\n\n".join(e.text for e in es), date=es[0].date, kind=es[0].kind)
        for d, es in out.items()
    ]
