"""Case files for `verdict decide`: a program plus a patient, in the project's format or the
paper authors' reference format (detected from the content).

Project format (``verdict.case/v1``)::

    {"format": "verdict.case/v1", "program": {...TrialProgram...},
     "patient": {...ResolvedPatient...}            # or
     "patient_id": "p1", "mined": [{"atom": ..., "value": ..., "evidence": ...}, ...],
     "note": "optional patient note the evidence quotes come from"}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .decision import ExtractionConflict
from .errors import VerdictError, describe_validation_error
from .patient import MinedValue, ResolvedPatient, check_patient
from .policy import Policy, apply_policy, resolve
from .program import TrialProgram, check_program
from .reference import import_reference, is_reference_format

CASE_FORMAT = "verdict.case/v1"


class CaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["verdict.case/v1"] = CASE_FORMAT
    program: TrialProgram
    patient: ResolvedPatient | None = None
    patient_id: str | None = None
    mined: list[MinedValue] | None = None
    note: str | None = None


@dataclass
class Case:
    program: TrialProgram
    patient: ResolvedPatient | None = None
    patient_id: str = "patient"
    mined: list[MinedValue] | None = None
    note: str | None = None
    source: str = ""
    recorded_sat: dict[str, bool] = field(default_factory=dict)
    import_notes: list[str] = field(default_factory=list)
    conflicts: list[ExtractionConflict] = field(default_factory=list)  # found while importing

    def patient_under(self, policy: Policy) -> ResolvedPatient:
        """The resolved patient, with atoms the note leaves open resolved by ``policy``."""
        if self.patient is not None:
            return apply_policy(self.program, check_patient(self.program, self.patient), policy)
        return resolve(self.program, self.patient_id, self.mined or [], policy)


def load_case(path: str | Path) -> Case:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise VerdictError(f"{path.name}: not valid JSON ({e})") from None
    if is_reference_format(data):
        ref = import_reference(
            data,
            trial_id=path.name.split("__")[0],
            patient_id=path.parent.name or "patient",
            source=path.name,
        )
        return Case(
            program=ref.program,
            patient=ref.patient,
            patient_id=ref.patient.patient_id,
            source=str(path),
            recorded_sat=ref.recorded_sat,
            import_notes=ref.notes,
            conflicts=ref.conflicts,
        )
    if not isinstance(data, dict) or data.get("format") != CASE_FORMAT:
        raise VerdictError(f"{path.name}: neither a '{CASE_FORMAT}' case file nor the reference format")
    try:
        cf = CaseFile.model_validate(data)
    except ValidationError as e:
        raise VerdictError(f"{path.name}: invalid case file", describe_validation_error(e, "case")) from None
    program = check_program(cf.program)
    if cf.patient is None and cf.mined is None:
        raise VerdictError(f"{path.name}: a case needs 'patient' or 'mined'")
    patient = cf.patient
    if patient is not None:
        patient = check_patient(program, patient)
    return Case(
        program=program,
        patient=patient,
        patient_id=cf.patient_id or (patient.patient_id if patient else "patient"),
        mined=cf.mined,
        note=cf.note,
        source=str(path),
    )
