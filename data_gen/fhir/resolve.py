"""Atoms that coded FHIR facts decide, without the miner.

Given a trial program and a record, `resolve_coded` returns the core's `Resolution`s it can make
deterministically and the atoms left for the value miner, so a coded lab value is never re-guessed
from prose. A value outside its analyte's plausible range, or an age over the plausible maximum
(configs/fhir/codes.yaml), is refused: never observed, and named in `refused`:

- a numeric `lab_value` atom (a vital sign: also `demographic` / `other`) whose name - or, when the
  name names none, whose definition - names exactly one analyte of the code map, whose unit the
  analyte's facts convert to, from the most recent final Observation on or before the reference
  date (inside the atom's `within` window, if it has one);
- a numeric `demographic` age atom (unit years or none) from Patient.birthDate at the reference date
  (a partial birth date gives bounds).

Each resolution is `observed`, with evidence naming the resource and any conversion, e.g.
`Observation/123: creatinine 1.199 mg/dL (converted from 106 umol/L), 2024-05-01`, and
`evidence_source` = `Observation/123`. Atoms not resolved get a note saying why (ids only).
"""

from __future__ import annotations

import datetime as dt
import functools
import re

from pydantic import BaseModel, ConfigDict, Field
from verdict.core.patient import Bounds, Resolution, ResolvedPatient, value_type_problems
from verdict.core.program import Atom, TrialProgram

from .code_map import CodeMap, load_code_map
from .errors import UnitConversionError
from .models import CodedFact, FhirPatientRecord
from .units import convert, ucum_code

USABLE_STATUS = ("final", "amended", "corrected")
_AGE = re.compile(r"(^|[^a-z])age([^a-z]|$)")
# an age at some event is not the patient's age now: such atoms are left for the miner
_AGE_AT_EVENT = re.compile(r"diagnos|onset|menarche|menopaus|first|start|gestation|bone age|when|at the time")
_WINDOW_DAYS = {"hours": 1 / 24, "days": 1, "weeks": 7, "months": 365.25 / 12, "years": 365.25}


class CodedResolutions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resolutions: list[Resolution] = Field(default_factory=list, description="atoms decided by coded facts")
    left_for_miner: list[str] = Field(default_factory=list, description="atom names the miner still reads")
    notes: dict[str, str] = Field(
        default_factory=dict, description="atom -> why coded facts did not decide it"
    )
    refused: list[str] = Field(
        default_factory=list, description="coded values refused as implausible, by resource (no values)"
    )

    @property
    def decided(self) -> frozenset[str]:
        """The atoms the value miner is not asked (their values come from coded facts)."""
        return frozenset(r.atom for r in self.resolutions)

    def apply(self, patient: ResolvedPatient) -> ResolvedPatient:
        """`patient` (resolved from the miner's values under a policy) with the coded atoms' resolutions
        in place of what the policy made of them: coded facts are observations, never imputed over."""
        coded = {r.atom: r for r in self.resolutions}
        return patient.model_copy(update={"resolutions": [coded.get(r.atom, r) for r in patient.resolutions]})


def _words(text: str) -> str:
    return text.replace("_", " ").lower()


def _analyte_of(atom: Atom, code_map: CodeMap) -> tuple[str | None, str | None]:
    """(analyte, None) or (None, why not)."""
    found = code_map.analytes_named_in(_words(atom.name)) or code_map.analytes_named_in(atom.definition)
    allowed = [
        a
        for a in found
        if atom.kind == "lab_value"
        or (code_map.analytes[a].kind == "vital" and atom.kind in ("demographic", "other"))
    ]
    if not allowed:
        return None, None
    if len(allowed) > 1:
        return None, f"names several analytes ({', '.join(sorted(allowed))}); left for the miner"
    return allowed[0], None


def _window_start(atom: Atom, at: dt.date) -> dt.date | None:
    scope = atom.time_scope
    if scope is None or scope.kind != "within":
        return None
    return at - dt.timedelta(days=float(scope.amount) * _WINDOW_DAYS[scope.unit])


def _candidates(
    record: FhirPatientRecord, analyte: str, at: dt.date, since: dt.date | None, code_map: CodeMap
) -> tuple[list[CodedFact], list[str]]:
    """The usable facts, most recent first, and why implausible ones were refused."""
    out, refused = [], []
    for f in record.facts:
        if f.category != "observation" or f.canonical != analyte or f.status not in USABLE_STATUS:
            continue
        if isinstance(f.value, bool) or not isinstance(f.value, (int, float)) or not f.effective:
            continue
        try:
            day = dt.date.fromisoformat(f.effective[:10])
        except ValueError:
            continue
        if day > at or (since is not None and day < since):
            continue
        why = code_map.implausible(f)
        if why is not None:
            refused.append(why)
            continue
        out.append(f)
    return sorted(out, key=lambda f: (f.effective or "", f.resource), reverse=True), refused


def _fact_label(f: CodedFact) -> str:
    return f.resource + (f" component[{f.component}]" if f.component is not None else "")


def _lab(
    atom: Atom, analyte: str, record: FhirPatientRecord, at: dt.date, code_map: CodeMap, refused: list[str]
) -> tuple[Resolution | None, str]:
    if not atom.unit:
        return None, f"{analyte}: the atom has no unit to convert to; left for the miner"
    try:
        ucum_code(atom.unit)
    except UnitConversionError as e:
        return None, f"{analyte}: atom unit: {e.summary}; left for the miner"
    facts, implausible = _candidates(record, analyte, at, _window_start(atom, at), code_map)
    refused += [r for r in implausible if r not in refused]
    if not facts:
        if implausible:
            return None, f"{implausible[0]}; left for the miner"
        return None, f"{analyte}: no final coded Observation on or before {at.isoformat()}" + (
            " inside the atom's time window" if atom.time_scope and atom.time_scope.kind == "within" else ""
        )
    fact = facts[0]
    try:
        c = convert(float(fact.value), fact.unit, atom.unit, analyte)
    except UnitConversionError as e:
        return None, f"{_fact_label(fact)}: {e.summary}; left for the miner"
    value: float | int = c.value
    rounded = ""
    if atom.domain == "int":
        value = int(round(c.value))
        rounded = " (rounded)" if value != c.value else ""
    problems = value_type_problems(atom.domain, value, None)
    if problems:  # e.g. beyond the core's number range: the same check mined values pass
        return None, f"{_fact_label(fact)}: {problems[0]}; left for the miner"
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    conv = f" {c.describe()}" if c.converted else ""
    evidence = f"{_fact_label(fact)}: {analyte} {shown} {atom.unit}{rounded}{conv}, {fact.effective[:10]}"
    return Resolution(
        atom=atom.name, status="observed", value=value, evidence=evidence, evidence_source=fact.resource
    ), ""


def _age(
    atom: Atom, record: FhirPatientRecord, code_map: CodeMap, refused: list[str]
) -> tuple[Resolution | None, str]:
    if _AGE_AT_EVENT.search(_words(atom.name) + " " + atom.definition.lower()):
        return None, "age: an age at an event, not at the reference date; left for the miner"
    if atom.unit and atom.unit.strip().lower() not in ("years", "year", "a", "yr", "y"):
        return None, f"age: unit '{atom.unit[:20]}' is not years; left for the miner"
    source, at = record.patient_ref, record.reference_date
    oldest = record.age_years if record.age_years is not None else (record.age_range or (0, 0))[1]
    too_old = code_map.dates.age_problem(oldest)
    if too_old:
        why = f"{source}: birthDate {too_old}; not used"
        if why not in refused:
            refused.append(why)
        return None, f"age: {why}; left for the miner"
    if record.age_years is not None:
        value = record.age_years if atom.domain == "int" else float(record.age_years)
        return Resolution(
            atom=atom.name,
            status="observed",
            value=value,
            evidence_source=source,
            evidence=f"{source}: born {record.birth_date}, {record.age_years} years at {at}",
        ), ""
    if record.age_range is not None:
        lo, hi = record.age_range
        return Resolution(
            atom=atom.name,
            status="observed",
            bounds=Bounds(lo=lo, hi=hi),
            evidence_source=source,
            evidence=f"{source}: born {record.birth_date}, {lo}-{hi} years at {at}",
        ), ""
    return None, "age: no birth date on the Patient; left for the miner"


def resolve_coded(program: TrialProgram, record: FhirPatientRecord, code_map: CodeMap) -> CodedResolutions:
    """The atoms of `program` that the record's coded facts decide, and those left for the miner."""
    at = dt.date.fromisoformat(record.reference_date)
    out = CodedResolutions()
    for atom in program.atoms:
        resolution, why = None, ""
        if atom.domain in ("int", "real"):
            if atom.kind == "demographic" and _AGE.search(_words(atom.name)):
                resolution, why = _age(atom, record, code_map, out.refused)
            else:
                analyte, why = _analyte_of(atom, code_map)
                if analyte is not None:
                    resolution, why = _lab(atom, analyte, record, at, code_map, out.refused)
        if resolution is not None:
            out.resolutions.append(resolution)
        else:
            out.left_for_miner.append(atom.name)
            if why:
                out.notes[atom.name] = why
    return out


@functools.lru_cache(maxsize=1)
def default_code_map() -> CodeMap:
    """The site's code map (configs/fhir/codes.yaml), read once per process."""
    return load_code_map()


def coded_resolutions(program: TrialProgram, record: FhirPatientRecord) -> CodedResolutions:
    """`resolve_coded` with the site's code map (configs/fhir/codes.yaml, read once per process)."""
    return resolve_coded(program, record, default_code_map())
