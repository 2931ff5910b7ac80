"""The recorded teacher: the paper authors' recorded formalizer outputs as value-miner records.

`../shared/data/reference/v6/<patient>/<NCT id>[variant]__full.json` holds, per patient-trial
variant, the program the authors' trial parser wrote and the values their value miner (GPT-4.1
era) read from the SIGIR note. `verdict_core.reference` turns a file into a TrialProgram and a
resolved patient; here each side becomes one value-miner record: our miner prompt for that side's
atoms and the note, with the recorded values as the teacher's answer, checked like any teacher
output (an evidence quote that is not in the note rejects the record). No API is called.

Mapping of values: observed -> the value (or bounds) with its evidence; imputed by the authors'
silence default or unresolved -> null, since our miner reports only what the note establishes and
leaves defaults to the site's policy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from verdict_core.errors import VerdictError

from .formalizer import (
    check_miner_output,
    compact,
    miner_messages,
    quote_in_note,
    side_atoms,
)
from .protocol import StageResult
from .records import RecordStore
from .sources import load_patients

TEACHER = "recorded-v6"
MODEL = "gpt-4.1 (recorded by the paper authors)"


@dataclass
class RecordedSummary:
    run_dir: str
    files: int = 0
    accepted: int = 0
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


_QUOTED = re.compile(r'"([^"]{3,})"|“([^”]{3,})”|‘([^’]{3,})’|(?<![A-Za-z])\'([^\']{3,})\'(?![A-Za-z])')


def recorded_evidence(evidence: str, note: str) -> str:
    """The authors' evidence strings mix quotes with commentary ('"pain started while walking"; no
    pain at rest'). When every quoted part occurs in the note, those parts are the evidence."""
    parts = [next(g for g in m.groups() if g) for m in _QUOTED.finditer(evidence)]
    if parts and all(quote_in_note(p, note) for p in parts) and not quote_in_note(evidence, note):
        return " ... ".join(p.strip() for p in parts)
    return evidence


def recorded_answer(case, side: str, names: list[str], note: str) -> str:
    """The recorded values of one side, in our value-miner output format."""
    have = case.patient.by_atom()
    values = []
    for n in names:
        r = have.get(n)
        if r is not None and r.status == "observed":
            v = {"atom": n, "value": r.value, "evidence": recorded_evidence(r.evidence or "", note)}
            if r.bounds is not None:
                v["bounds"] = r.bounds.model_dump(exclude_defaults=True)
            values.append(v)
        else:
            values.append({"atom": n, "value": None, "evidence": ""})
    return compact({"values": values})


def import_recorded(reference_dir: str | Path, patients_path: str | Path, out_dir: str | Path = "runs",
                    name: str = "recorded-v6", prompt_version: str = "v1") -> RecordedSummary:
    from verdict_core.reference import load_reference

    ref = Path(reference_dir)
    files = sorted(ref.glob("*/*__full.json"))
    if not files:
        raise VerdictError(f"no reference files (<patient>/<trial>__full.json) under {ref}")
    patients = load_patients(patients_path, data_class="public")
    notes = patients.by_id("patient_id")
    run_dir = Path(out_dir) / name
    store = RecordStore(run_dir / "records.sqlite")
    out = RecordedSummary(run_dir=str(run_dir), problems=list(patients.problems))
    try:
        store.set_meta("config", {"name": name, "recorded": True, "reference_dir": str(reference_dir),
                                  "patients": str(patients_path), "teachers": {"miner": TEACHER}})
        for f in files:
            out.files += 1
            patient_id, stem = f.parent.name, f.name.split("__")[0]
            m = re.match(r"(NCT\d+)", stem)
            trial_id = m.group(1) if m else stem
            note = notes.get(patient_id)
            if note is None:
                out.problems.append(f"{f.parent.name}/{f.name}: no note for patient '{patient_id}'")
                continue
            try:
                case = load_reference(f)
            except VerdictError as e:
                out.problems.append(f"{f.parent.name}/{f.name}: {e.summary}")
                continue
            for side in ("inclusion", "exclusion"):
                names = side_atoms(case.program, side)
                if not names:
                    continue
                stage = f"miner_{side}"
                answer = recorded_answer(case, side, names, note.text)
                check = check_miner_output(answer, "stop", case.program, names, note.text, max_tokens=0)
                res = StageResult(
                    stage=stage, status="accepted" if check.ok else "rejected", reason=check.reason,
                    problems=check.messages, teacher=TEACHER, model=MODEL,
                    prompt_version=f"miner_{side}@{prompt_version}",
                    messages=miner_messages(case.program, note.text, side, names, prompt_version),
                    output_json=check.output_json if check.ok else None,
                )
                store.put(res, trial_id, patient_id, item=stem)
                if check.ok:
                    out.accepted += 1
                else:
                    out.rejected += 1
                    out.reasons[check.reason or "?"] = out.reasons.get(check.reason or "?", 0) + 1
        store.set_meta("status", "complete")
    finally:
        store.close()
    return out
