"""The site code map (configs/fhir/codes.yaml): which codes (LOINC, SNOMED CT, RxNorm, ICD-10, OMOP
concept ids) mean which canonical fact, in which canonical unit, and which words name that fact in an atom.

Each analyte also states the range of values a patient can have (`plausible`, in its canonical unit),
and `dates` bounds reference dates and ages (`plausible.py`): a value outside is refused.

Loaded with the project's strict config loader (`verdict.core.configs`): an unknown key, an unknown
code-system prefix, a unit outside the UCUM table or a code mapped twice is an error naming it.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, PrivateAttr, model_validator
from verdict.core.configs import StrictModel, find_config
from verdict.core.errors import VerdictError

from .errors import CodeMapError, UnitConversionError
from .models import CodedFact
from .plausible import PlausibleDates, PlausibleRange
from .units import convert, ucum_code

DEFAULT_CODE_MAP = "codes"


class Analyte(StrictModel):
    """A measured quantity (a lab or a vital sign) that numeric atoms can be resolved from."""

    kind: Literal["lab", "vital"] = Field(
        description="lab: resolves lab_value atoms; vital: also "
        "demographic/other atoms (weight, BMI, blood pressure)"
    )
    unit: str = Field(description="canonical UCUM unit the facts are reported in (e.g. mg/dL)")
    names: list[str] = Field(
        min_length=1,
        description="phrases that name the analyte in an atom's name or "
        "definition (case-insensitive, whole words; underscores count as spaces)",
    )
    not_names: list[str] = Field(
        default_factory=list,
        description="phrases that name a different quantity "
        "containing a name (e.g. 'creatinine clearance'): such an atom is not matched",
    )
    codes: list[str] = Field(
        min_length=1,
        description="codes as PREFIX:CODE (e.g. loinc:2160-0); prefixes are the keys of `systems`",
    )
    plausible: PlausibleRange | None = Field(
        None, description="values a patient can have, in `unit`; a value outside is refused"
    )


class Concept(StrictModel):
    """A coded condition, medication or procedure: shown as a canonical fact, not resolved yet."""

    kind: Literal["condition", "medication", "procedure"] = Field(description="which resources carry it")
    codes: list[str] = Field(
        min_length=1,
        description="codes as PREFIX:CODE (ICD-10 codes match by prefix: icd10:E11 matches E11.9)",
    )


class CodeMap(StrictModel):
    version: int = Field(1, description="format version of this file")
    systems: dict[str, str] = Field(description="code-system prefix -> FHIR system URI")
    analytes: dict[str, Analyte] = Field(
        default_factory=dict, description="canonical analyte name -> analyte"
    )
    concepts: dict[str, Concept] = Field(
        default_factory=dict, description="canonical concept name -> concept"
    )
    dates: PlausibleDates = Field(
        default_factory=PlausibleDates, description="plausible reference dates and ages"
    )
    unit_concepts: dict[int, str] = Field(
        default_factory=dict,
        description="OMOP unit concept id -> UCUM code, for a database without the unit's concept row",
    )
    _by_code: dict | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check(self):
        problems: list[str] = []
        seen: dict[tuple[str, str], str] = {}
        entries = [("analytes", n, a.codes) for n, a in self.analytes.items()]
        entries += [("concepts", n, c.codes) for n, c in self.concepts.items()]
        for section, name, codes in entries:
            for i, ref in enumerate(codes):
                prefix, _, code = ref.partition(":")
                if prefix not in self.systems or not code:
                    problems.append(
                        f"{section}.{name}.codes[{i}]: '{ref}' is not PREFIX:CODE with a prefix "
                        f"from systems ({', '.join(sorted(self.systems))})"
                    )
                    continue
                key = (self.systems[prefix], code)
                if key in seen:
                    problems.append(
                        f"{section}.{name}.codes[{i}]: '{ref}' is already mapped to '{seen[key]}'"
                    )
                seen[key] = name
        for name, a in self.analytes.items():
            try:
                ucum_code(a.unit)
            except UnitConversionError as e:
                problems.append(f"analytes.{name}.unit: {e}")
        for concept_id, unit in self.unit_concepts.items():
            try:
                ucum_code(unit)
            except UnitConversionError as e:
                problems.append(f"unit_concepts.{concept_id}: {e}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- look-ups ---------------------------------------------------------------------------------
    def _index(self) -> dict[tuple[str, str], tuple[str, str]]:
        cached = self._by_code
        if cached is None:
            cached = {}
            for section, items in (("analyte", self.analytes), ("concept", self.concepts)):
                for name, entry in items.items():
                    for ref in entry.codes:
                        prefix, _, code = ref.partition(":")
                        cached[(self.systems[prefix], code)] = (section, name)
            self._by_code = cached
        return cached

    def lookup(self, system: str | None, code: str | None) -> tuple[str, str] | None:
        """('analyte'|'concept', canonical name) for a coding, or None. ICD-10 also by prefix."""
        if not system or not code:
            return None
        index = self._index()
        found = index.get((system, code))
        if found is None and "icd-10" in system.lower():
            parts = code.split(".")[0]
            for n in range(len(parts), 2, -1):
                found = index.get((system, parts[:n]))
                if found:
                    break
        return found

    def implausible(self, fact: CodedFact) -> str | None:
        """Why a numeric fact's value is refused (outside its analyte's plausible range), or None.
        Converts the value itself: a record given to the API may carry any `converted`."""
        analyte = self.analytes.get(fact.canonical or "")
        value = fact.value
        if analyte is None or analyte.plausible is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        try:
            canonical = convert(float(value), fact.unit, analyte.unit, fact.canonical).value
        except UnitConversionError:
            return None  # not used anyway: its conversion problem says why
        where = f" component[{fact.component}]" if fact.component is not None else ""
        return analyte.plausible.problem(
            canonical, f"{fact.resource}{where}: value of {fact.canonical}", ucum_code(analyte.unit)
        )

    def analytes_named_in(self, text: str) -> list[str]:
        """Canonical analytes whose names occur in `text` (and none of their not_names)."""
        hay = " " + re.sub(r"[^a-z0-9%]+", " ", text.lower()) + " "
        out = []
        for name, a in self.analytes.items():
            if any(_phrase(n) in hay for n in a.not_names):
                continue
            if any(_phrase(n) in hay for n in a.names):
                out.append(name)
        return out


def _phrase(text: str) -> str:
    return " " + re.sub(r"[^a-z0-9%]+", " ", text.lower()).strip() + " "


def load_code_map(name_or_path: str | os.PathLike = DEFAULT_CODE_MAP) -> CodeMap:
    """configs/fhir/NAME.yaml (or a path)."""
    from verdict.core import configs

    try:
        path = find_config("fhir", name_or_path)
        return configs.build(CodeMap, configs.read_yaml(path), where=f"FHIR code map {path.name}")
    except VerdictError as e:
        raise CodeMapError(e.summary, e.problems) from None
