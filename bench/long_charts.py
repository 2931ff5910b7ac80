"""Long charts for machinery checks, built from the shared data, and the scripted reader/miner that
answers them: one implementation for `benchmarks/chart_agreement.py` and the bench's
`chart_reading` stage (`bench/chart_reading.py`).

- A **recorded pair** is one reference file (`<patient>/<trial>[variant]__full.json`): the recorded
  program (fitted to the grammar) and the values the authors' miner read from the patient's note,
  each kept only when this project's check accepts its line (a refused line is counted, never
  replayed).
- A **long chart** is the note among documents that add no fact about the patient: other trials'
  criteria texts (`filler_documents`: distinct texts, so de-duplication removes none; none holding
  a piece of a recorded quote), the note in the middle.
- The **script** of the scripted OpenAI-compatible server answers a value only when its recorded
  quote is in the text it was sent (`only_quoted`: a miner that misses nothing it is shown), and
  plays the chart reader (`auto: excerpts`: the pieces of the recorded quotes the passage holds).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

READER_MARK = "You read part of a patient's chart"  # in the reader prompt's system message
_STEM = re.compile(r"^(NCT\d+)")


@dataclass
class RecordedPair:
    """One reference file: its recorded program and the values replayable from the note."""

    patient_id: str
    trial_id: str
    case: str  # the file's stem: the trial id and its variant letter
    program: object  # verdict.core.program.TrialProgram
    note: str
    values: dict[str, dict]  # atom -> recorded value line (observed values only, no "atom" key)
    refused: list[str] = field(default_factory=list)  # "<case>:<atom>" lines our check refuses

    @property
    def pair_id(self) -> str:
        return f"{self.patient_id}__{self.trial_id}"

    def quotes(self) -> list[str]:
        return [v["evidence"] for v in self.values.values() if v.get("evidence")]


def reference_files(root: str | Path) -> dict[str, list[Path]]:
    """pair id (`<patient>__<NCT id>`) -> its reference files (variants in name order)."""
    out: dict[str, list[Path]] = {}
    for f in sorted(Path(root).glob("*/*__full.json")):
        m = _STEM.match(f.name)
        if m:
            out.setdefault(f"{f.parent.name}__{m.group(1)}", []).append(f)
    return out


def recorded_pair(path: Path, note: str) -> RecordedPair:
    """The reference file's program and the recorded values our check accepts against `note`."""
    from verdict.core.reference import load_reference
    from verdict.data_gen.formalizer import check_miner_output, compact, side_atoms
    from verdict.data_gen.recorded import fit_to_grammar, recorded_answer

    case = fit_to_grammar(load_reference(path))
    values, refused = {}, []
    for side in ("inclusion", "exclusion"):
        answer = recorded_answer(case, side, side_atoms(case.program, side), note, sparse=True)
        for v in json.loads(answer)["values"]:
            # a recorded line our check refuses (a quote not in the note, a wrong type) is left out, as
            # the recorded import leaves its record out: counted, never replayed
            line = compact({"values": [v]})
            if check_miner_output(
                line, "stop", case.program, [v["atom"]], note, max_tokens=0, sparse=True
            ).ok:
                values[v.pop("atom")] = v
            else:
                refused.append(f"{path.name}:{v['atom']}")
    stem = path.name.removesuffix("__full.json")
    trial = _STEM.match(stem).group(1)
    return RecordedPair(path.parent.name, trial, stem, case.program, note, values, refused)


def load_recorded_pairs(root: str | Path, notes: dict[str, str]) -> list[RecordedPair]:
    """Every reference file whose patient has a note, in file order."""
    out = []
    for files in reference_files(root).values():
        for f in files:
            if f.parent.name in notes:
                out.append(recorded_pair(f, notes[f.parent.name]))
    return out


def trial_text(row: dict) -> str:
    return f"{row['title']}\n\n{row.get('inclusion') or ''}\n\n{row.get('exclusion') or ''}".strip()


def filler_documents(
    trials_path: str | Path,
    exclude: set[str],
    tokens: int,
    count: Callable[[str], int],
    quotes: Iterable[str] = (),
    *,
    max_doc_tokens: int = 1500,
) -> list:
    """Other trials' criteria texts (benchmarks-layout trials JSONL), distinct, about `tokens` tokens
    in all; none of the trials in `exclude`, none holding a piece of a recorded quote (`quotes`: it
    would put the patient's quoted words elsewhere in the chart)."""
    from verdict.data_gen.formalizer import NoteDocument, normalize_ws, split_pieces

    pieces = {p for q in quotes for p in split_pieces(q)}
    docs, total, seen = [], 0, set()
    if tokens <= 0:
        return docs
    for line in Path(trials_path).read_text().splitlines():
        if not line.strip():
            continue
        t = json.loads(line)
        text = trial_text(t)
        if t["nct_id"] in exclude or text in seen or count(text) > max_doc_tokens:
            continue
        flat = normalize_ws(text)
        if any(p in flat for p in pieces):
            continue
        seen.add(text)
        docs.append(NoteDocument(id=f"doc-{t['nct_id']}", text=text, kind="other_trial"))
        total += count(text)
        if total >= tokens:
            break
    return docs


def chart_of(patient_id: str, note: str, docs: list, data_class: str = "private"):
    """The patient's long chart: the note (document `note`) in the middle of `docs`."""
    from verdict.data_gen.formalizer import NoteDocument, PatientDoc

    mid = len(docs) // 2
    doc = NoteDocument(id="note", text=note, kind="admission_note")
    return PatientDoc(patient_id=patient_id, documents=[*docs[:mid], doc, *docs[mid:]], data_class=data_class)


def replay_script(
    values: dict[str, dict | list[dict]],
    quotes: list[str],
    *,
    sparse: bool = True,
    quoted_in: str = "request",
):
    """The scripted server as reader (the pieces of `quotes` each passage holds) and as value miner
    (`values`, each only when its quote is in the text sent; an atom may list several lines).
    `quoted_in="note"`: only the note the prompt quotes counts as sent (a script for many patients)."""
    from verdict.data_gen.scripted_server import Match, Rule, Script
    from verdict.data_gen.scripted_server import ScriptedResponse as R

    return Script(
        rules=[
            Rule(
                match=Match(contains=[READER_MARK]),
                responses=[R(auto="excerpts", auto_excerpts=quotes, quoted_in=quoted_in)],
            )
        ],
        default=R(
            auto="sparse" if sparse else "nulls", auto_values=values, only_quoted=True, quoted_in=quoted_in
        ),
    )


def reference_script(pairs: list[RecordedPair], *, drop_quotes: Iterable[str] = ()):
    """One script for many recorded pairs: every atom's recorded lines (one per pair that has it,
    longer quotes first), every pair's quotes for the reader, less `drop_quotes` (a reader that
    misses those excerpts)."""
    lines: dict[str, list[dict]] = {}
    for p in pairs:
        for atom, v in p.values.items():
            if v not in lines.setdefault(atom, []):
                lines[atom].append(v)
    for xs in lines.values():
        xs.sort(key=lambda v: -len(v.get("evidence") or ""))
    dropped = set(drop_quotes)
    quotes = list(dict.fromkeys(q for p in pairs for q in p.quotes() if q not in dropped))
    return replay_script(lines, quotes, quoted_in="note")
