"""The value miner's request and the check of its answer: which atoms a side asks, the messages of
one call, the training target, and `check_miner_output` (see `miner.py` for the stage)."""

from __future__ import annotations

import json

from verdict.core.patient import MinedValue, ValueMinerOutput, value_type_problems
from verdict.core.program import TrialProgram

from .checks import SIDES, Check, compact, parse_output, quote_in_note
from .prompt_templates import stage_prompt


def check_side(side: str) -> None:
    """Refuse a side the miner has no prompt for, naming it."""
    if side not in SIDES:
        raise ValueError(f"side must be inclusion or exclusion (got '{side}')")


def side_atoms(program: TrialProgram, side: str) -> list[str]:
    """The atoms a value-miner pass asks about: those the side's criteria use (through definitions too)."""
    sides = program.atom_sides()
    return [a.name for a in program.atoms if side in sides.get(a.name, set())]


def render_atoms(program: TrialProgram, names: list[str]) -> str:
    """The prompt's atom list: one JSON object per atom (name, type, kind, unit, definition, time
    scope), one a line, in the order given (`asked_atoms` reads it back)."""
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
