"""The patient side: what the value miner reads off a note, and the resolved patient (paper Def. 5).

``MinedValue``   what a value-miner pass emits for one atom: a value or null, with an evidence quote.
``Resolution``   r_i = (value, status, evidence, imputation): observed from the note, imputed by a
                 policy rule, or unresolved (free for the solver).
``Bounds``       threshold-level evidence for a numeric atom when the raw value is absent
                 ("platelets >= 100k"): the atom is known to lie in an interval.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from .configs import StrictModel
from .errors import PatientError, describe_validation_error
from .formula import AtomName, number_problem
from .program import TrialProgram

Value = StrictBool | StrictInt | StrictFloat
Status = Literal["observed", "imputed", "unresolved"]
PATIENT_FORMAT = "verdict.resolved_patient/v1"


class Bounds(StrictModel):
    lo: float | None = None
    hi: float | None = None
    lo_strict: bool = False
    hi_strict: bool = False

    @model_validator(mode="after")
    def _nonempty(self):
        if self.lo is None and self.hi is None:
            raise ValueError("bounds need lo or hi")
        for v in (self.lo, self.hi):
            if v is not None and not math.isfinite(v):
                raise ValueError("bounds must be finite numbers")
        if self.lo is not None and self.hi is not None:
            if self.lo > self.hi or (self.lo == self.hi and (self.lo_strict or self.hi_strict)):
                raise ValueError(f"empty interval: lo={self.lo} hi={self.hi}")
        return self

    def contains(self, x: float) -> bool:
        return in_interval(self, x)

    def text(self, name: str) -> str:
        parts = []
        if self.lo is not None:
            parts.append(f"{name} {'>' if self.lo_strict else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{name} {'<' if self.hi_strict else '<='} {self.hi:g}")
        return " and ".join(parts)


class Imputation(StrictModel):
    """Which policy rule supplied an imputed value, and why (a_i in Def. 5)."""

    policy: str
    policy_version: str
    rule: str
    reason: str


class MinedValue(StrictModel):
    """One atom as a value-miner pass reports it."""

    atom: AtomName
    value: Value | None = Field(description="the value the note establishes, or null if it does not")
    evidence: str = Field(default="", description="verbatim quote from the note; empty when value is null")
    bounds: Bounds | None = Field(
        default=None, description="numeric atoms only: interval the note establishes"
    )

    @field_validator("bounds", mode="before")
    @classmethod
    def _empty_bounds_are_none(cls, v):
        # a decoder can emit {"lo": null, "hi": null}: no interval, not an error worth a repair
        if isinstance(v, dict) and v.get("lo") is None and v.get("hi") is None:
            return None
        return v


class ValueMinerOutput(StrictModel):
    values: list[MinedValue]


class Resolution(StrictModel):
    atom: AtomName
    status: Status
    value: Value | None = None
    bounds: Bounds | None = None
    evidence: str | None = None
    evidence_source: str | None = Field(default=None, description="id of the document the evidence quotes")
    imputation: Imputation | None = None
    note: str | None = Field(default=None, description="the miner's assessment, if any")

    @model_validator(mode="after")
    def _consistent(self):
        if isinstance(self.value, float) and not math.isfinite(self.value):
            raise ValueError(f"atom '{self.atom}': value must be finite")
        has_value = self.value is not None or self.bounds is not None
        if self.value is not None and self.bounds is not None:
            raise ValueError(f"atom '{self.atom}': give either a value or bounds, not both")
        if self.status == "unresolved" and (has_value or self.imputation):
            raise ValueError(f"atom '{self.atom}': an unresolved atom has no value, bounds or imputation")
        if self.status == "observed" and not has_value:
            raise ValueError(f"atom '{self.atom}': observed but no value or bounds")
        if self.status == "imputed" and (not has_value or self.imputation is None):
            raise ValueError(
                f"atom '{self.atom}': imputed needs a value (or bounds) and an imputation record"
            )
        if self.status == "observed" and self.imputation is not None:
            raise ValueError(f"atom '{self.atom}': observed values carry no imputation record")
        return self

    @property
    def resolved(self) -> bool:
        return self.status != "unresolved"


class PolicyRef(StrictModel):
    name: str
    version: str


class ResolvedPatient(StrictModel):
    format: Literal["verdict.resolved_patient/v1"] = PATIENT_FORMAT
    patient_id: str
    trial_id: str
    program_hash: str = Field(description="content_hash of the trial program these values were resolved for")
    policy: PolicyRef | None = None
    resolutions: list[Resolution]

    def by_atom(self) -> dict[str, Resolution]:
        return {r.atom: r for r in self.resolutions}

    def content_hash(self) -> str:
        body = self.model_dump(mode="json")
        for r in body["resolutions"]:  # unset: the hash of a patient written before the field existed
            if r.get("evidence_source") is None:
                r.pop("evidence_source", None)
        canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def load_patient(data: dict | str | bytes) -> ResolvedPatient:
    try:
        if isinstance(data, (str, bytes)):
            return ResolvedPatient.model_validate_json(data)
        return ResolvedPatient.model_validate(data)
    except ValidationError as e:
        raise PatientError("invalid resolved patient", describe_validation_error(e, "patient")) from None
    except ValueError as e:
        raise PatientError(f"invalid resolved patient: {e}") from None


def check_patient(program: TrialProgram, patient: ResolvedPatient) -> ResolvedPatient:
    """The patient must be resolved for this very program version, name only declared atoms, and
    give each a value of the atom's domain. Atoms the patient omits are unresolved."""
    problems: list[str] = []
    if patient.trial_id != program.trial_id:
        problems.append(
            f"trial_id: patient file is for trial '{patient.trial_id}', program is '{program.trial_id}'"
        )
    elif patient.program_hash != program.content_hash:
        problems.append(
            f"program_hash: patient was resolved for program version {patient.program_hash}, "
            f"this program is {program.content_hash} (re-run the value miner for this version)"
        )
    table = program.atom_table()
    seen: set[str] = set()
    for i, r in enumerate(patient.resolutions):
        where = f"resolutions[{i}] '{r.atom}'"
        if r.atom in seen:
            problems.append(f"{where}: duplicate resolution for the same atom")
        seen.add(r.atom)
        atom = table.get(r.atom)
        if atom is None:
            problems.append(f"{where}: atom is not declared in trial program '{program.trial_id}'")
            continue
        problems.extend(f"{where}: {p}" for p in value_type_problems(atom.domain, r.value, r.bounds))
    if problems:
        raise PatientError(
            f"patient '{patient.patient_id}' does not fit trial program '{program.trial_id}'", problems
        )
    return patient


def value_type_problems(domain: str, value, bounds: Bounds | None) -> list[str]:
    if domain == "bool":
        if value is not None and not isinstance(value, bool):
            return [f"value {value!r} is not a boolean (atom domain is bool)"]
        if bounds is not None:
            return ["bounds given for a bool atom"]
        return []
    if isinstance(value, bool):
        return [f"value {value!r} is a boolean but the atom domain is {domain}"]
    for x, what in (
        (value, "value"),
        (bounds and bounds.lo, "bounds.lo"),
        (bounds and bounds.hi, "bounds.hi"),
    ):
        why = number_problem(x)
        if why:  # 10**400 from a note must be a miner-output problem, not a crash in the solver
            return [f"{what}: {why}"]
    if domain == "int" and isinstance(value, float) and not value.is_integer():
        return [f"value {value!r} is not an integer (atom domain is int)"]
    return []


def in_interval(iv, x: float) -> bool:
    """Whether x lies in an interval given by lo/hi/lo_strict/hi_strict (None = unbounded):
    one definition for patient bounds, numeric cells and requirement intervals."""
    if iv.lo is not None and (x < iv.lo or (iv.lo_strict and x == iv.lo)):
        return False
    return not (iv.hi is not None and (x > iv.hi or (iv.hi_strict and x == iv.hi)))
