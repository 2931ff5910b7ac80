"""The value-miner stage: a patient note + a side's atoms -> checked values with evidence."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pydantic import ValidationError

from verdict_core.errors import describe_validation_error
from verdict_core.patient import MinedValue, ValueMinerOutput, value_type_problems
from verdict_core.program import TrialProgram

from ..cache import CachedCall
from ..prompt_templates import stage_prompt
from ..protocol import PatientDoc, StageResult
from .checks import SIDES, Check, compact, core_schema, parse_json, quote_in_note, with_atom_enum

if TYPE_CHECKING:
    from .runtime import Formalizer


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


def miner_messages(program: TrialProgram, note: str, side: str, names: list[str], version: str = "v1") -> list[dict[str, str]]:
    return stage_prompt(f"miner_{side}", version).render(NOTE=note.strip(), ATOMS=render_atoms(program, names))


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


async def mine_values(fz: "Formalizer", program: TrialProgram, note: PatientDoc | str, side: str, *,
                      data_class: str | None = None) -> StageResult:
    """Patient note + the side's atoms -> checked values with evidence (one value-miner pass)."""
    if side not in SIDES:
        raise ValueError(f"side must be inclusion or exclusion (got '{side}')")
    text = note.text if isinstance(note, PatientDoc) else note
    pid = note.patient_id if isinstance(note, PatientDoc) else "-"
    dclass = data_class or (note.data_class if isinstance(note, PatientDoc) else "private")
    names = side_atoms(program, side)
    stage = f"miner_{side}"
    messages = fz.miner_messages(program, text, side, names)
    if not names:  # nothing to ask: no call, an empty (trivially valid) answer
        return StageResult(stage=stage, status="accepted", teacher=fz.endpoint.name, model=fz.endpoint.model,
                           prompt_version=fz.prompt(stage).ident, messages=messages,
                           output_json=compact({"values": []}), output=[])
    schema = with_atom_enum(core_schema("value-miner"), names)

    def validate(call: CachedCall) -> Check:
        return check_miner_output(call.content, call.finish_reason, program, names, text,
                                  max_tokens=fz.endpoint.max_tokens.for_stage(stage))

    return await fz._stage(stage, messages, schema, "value_miner_output", validate, patient_text=True,
                             data_class=dclass, ids=f"trial={program.trial_id} patient={pid}", sensitive=(text,))
