"""The extraction-resolution arbiter (paper appendix A.5), in one home: the stage that re-reads the
chart for atoms whose values contradict the program's definitional constraints (`arbitrate`), when
it is asked (`definition_conflicts`), and how its overrides decide again (`redecide`). The service
(serve/optional_stages.py) and the bench formalizer backend use it, so both ask it on the same atoms
and apply its overrides the same way. Opt-in (`api.formalizer.arbiter`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from verdict.core.decision import Override
from verdict.core.engine import Engine, FixedOverrides, apply_overrides
from verdict.core.formula import render
from verdict.core.patient import value_type_problems
from verdict.core.program import TrialProgram

from .cache import CachedCall
from .checks import Check, compact, parse_output, quote_in_note, with_atom_enum
from .protocol import ArbiterOutput, PatientDoc, StageResult

if TYPE_CHECKING:
    from .runtime import Runtime


def definition_conflicts(decision) -> list:
    """The facts the core set aside because they contradict the program's definitional constraints:
    the arbiter is asked only when there are some."""
    return [c for c in decision.conflicts if c.source == "definitions"]


async def redecide(adecide, program, patient, res):
    """The decision again with the arbiter's accepted overrides (the engine's own `arbiter=` hook;
    `adecide`: an async `Engine.decide`, e.g. the solver pool's), and the applied overrides with
    their evidence; None when the arbiter found no faithful correction (the solver result stands)."""
    if not res.output:
        return None, []
    said = json.loads(res.output_json or "{}").get("overrides", [])
    again = await adecide(program, patient, None, FixedOverrides(tuple(res.output)))
    evidence = {o.get("atom"): o.get("evidence", "") for o in said}
    applied = [
        {"atom": o.atom, "value": o.value, "evidence": evidence.get(o.atom, ""), "reason": o.reason}
        for o in again.overrides
    ]
    return again, applied


async def arbitrate(
    rt: Runtime, program: TrialProgram, note: PatientDoc | str, patient, conflicts
) -> StageResult:
    """Re-read the chart for atoms whose values contradict definitions; output: list[Override]."""

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
    messages = rt.prompt("arbiter").render(
        NOTE=text.strip(), VALUES=values, CONSTRAINTS=constraints or "(none)"
    )
    schema = with_atom_enum(ArbiterOutput.model_json_schema(), atoms)

    def validate(call: CachedCall) -> Check:
        out, problems = parse_output(
            call.content, call.finish_reason, rt.endpoint.max_tokens.arbiter, ArbiterOutput
        )
        if out is None:
            return Check(problems)
        for i, o in enumerate(out.overrides):
            where = f"overrides[{i}] '{o.atom}'"
            if o.atom not in atoms:
                problems.append(("coverage", f"{where}: not one of the conflicting atoms"))
                continue
            problems += [
                ("type", f"{where}: {p}") for p in value_type_problems(table[o.atom].domain, o.value, None)
            ]
            if o.value is not None and not quote_in_note(o.evidence, text):
                problems.append(("evidence", f"{where}: evidence is not a verbatim quote from the note"))
        overrides = [Override(atom=o.atom, value=o.value, reason=o.reason) for o in out.overrides]
        if not problems and overrides:
            problems += still_conflicting(rt.engine, program, patient, overrides)
        return Check(problems, overrides, compact(out.model_dump(mode="json")))

    return await rt.run_stage(
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


def still_conflicting(engine: Engine, program: TrialProgram, patient, overrides) -> list[tuple[str, str]]:
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
