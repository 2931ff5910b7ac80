"""UCUM unit conversion for labs and vitals: explicit tables, and a refusal with its reason for
anything they do not cover.

A unit is a UCUM code (`mg/dL`, `umol/L`, `10*9/L`, `mm[Hg]`, `Cel`) or one of a few common
spellings of one (`µmol/L`, `mmHg`, `x10^9/L`); each has a dimension and an affine map to that
dimension's base unit. Within a dimension conversion is exact arithmetic. Across dimensions only
analyte-specific rules apply: mass <-> substance concentration by the analyte's molar mass
(creatinine 113.12 g/mol: 1 mg/dL = 88.4 umol/L), and HbA1c % (NGSP) <-> mmol/mol (IFCC) by the
IFCC-NGSP master equation. mmol/mol is kept apart from % on purpose: for HbA1c they measure
different things, so a dimensional 5 % = 50 mmol/mol would be wrong.

Refused, with the reason: an unknown unit, a dimension mismatch, a cross-dimension conversion
without a known analyte or without that analyte's rule, a non-finite value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import UnitConversionError

SIGNIFICANT_DIGITS = 4  # a converted value keeps 4 significant digits (lab values carry 2-3)


@dataclass(frozen=True)
class Unit:
    code: str  # the UCUM code
    dimension: str
    factor: float  # base = value * factor + offset
    offset: float = 0.0


def _table() -> dict[str, Unit]:
    units: dict[str, Unit] = {}

    def add(code: str, dimension: str, factor: float, offset: float = 0.0) -> None:
        units[code] = Unit(code, dimension, factor, offset)

    masses = {"g": 1.0, "mg": 1e-3, "ug": 1e-6, "ng": 1e-9, "pg": 1e-12}
    moles = {"mol": 1.0, "mmol": 1e-3, "umol": 1e-6, "nmol": 1e-9, "pmol": 1e-12}
    volumes = {"L": 1.0, "dL": 0.1, "mL": 1e-3, "uL": 1e-6}
    for v, vf in volumes.items():
        for m, mf in masses.items():
            add(f"{m}/{v}", "mass_concentration", mf / vf)  # base g/L
        for m, mf in moles.items():
            add(f"{m}/{v}", "substance_concentration", mf / vf)  # base mol/L
    for code, per_litre in {
        "/L": 1.0,
        "/uL": 1e6,
        "/mm3": 1e6,
        "10*3/uL": 1e9,
        "10*3/mm3": 1e9,
        "10*9/L": 1e9,
        "10*6/uL": 1e12,
        "10*12/L": 1e12,
        "10*6/mL": 1e9,
    }.items():
        add(code, "number_concentration", per_litre)
    for code, f in {"U/L": 1.0, "U/mL": 1e3, "kU/L": 1e3}.items():
        add(code, "catalytic_concentration", f)
    for code, f in {
        "[IU]/L": 1.0,
        "m[IU]/L": 1e-3,
        "u[IU]/mL": 1e-3,
        "m[IU]/mL": 1.0,
        "[IU]/mL": 1e3,
    }.items():
        add(code, "arbitrary_concentration", f)
    add("%", "fraction", 0.01)
    add("1", "fraction", 1.0)
    add("mmol/mol", "substance_ratio", 1e-3)  # HbA1c IFCC; never equal to a % (see module doc)
    add("{INR}", "inr", 1.0)
    add("kg", "mass", 1.0)
    add("g", "mass", 1e-3)
    add("[lb_av]", "mass", 0.45359237)
    add("m", "length", 1.0)
    add("cm", "length", 0.01)
    add("mm", "length", 1e-3)
    add("[in_i]", "length", 0.0254)
    add("[ft_i]", "length", 0.3048)
    add("kg/m2", "mass_per_area", 1.0)
    add("Cel", "temperature", 1.0)
    add("[degF]", "temperature", 5 / 9, -32 * 5 / 9)
    add("K", "temperature", 1.0, -273.15)
    add("mm[Hg]", "pressure", 1.0)
    add("kPa", "pressure", 7.50062)
    add("/min", "rate", 1.0)
    add("mL/min", "volume_rate", 1.0)
    add("mL/min/{1.73_m2}", "volume_rate_per_area", 1.0)
    for code, days in {
        "a": 365.25,
        "mo": 365.25 / 12,
        "wk": 7.0,
        "d": 1.0,
        "h": 1 / 24,
        "min": 1 / 1440,
    }.items():
        add(code, "time", days)
    return units


UNITS = _table()

# Common non-UCUM spellings -> UCUM code (exact match first, then case-insensitive).
ALIASES = {
    "µmol/L": "umol/L",
    "μmol/L": "umol/L",
    "µg/L": "ug/L",
    "μg/L": "ug/L",
    "µg/dL": "ug/dL",
    "µg/mL": "ug/mL",
    "mcg/L": "ug/L",
    "mcg/dL": "ug/dL",
    "mcg/mL": "ug/mL",
    "µL": "uL",
    "x10^9/L": "10*9/L",
    "10^9/L": "10*9/L",
    "x10E9/L": "10*9/L",
    "G/L": "10*9/L",
    "x10^3/uL": "10*3/uL",
    "10^3/uL": "10*3/uL",
    "x10^3/µL": "10*3/uL",
    "K/uL": "10*3/uL",
    "/µL": "/uL",
    "x10^12/L": "10*12/L",
    "10^12/L": "10*12/L",
    "x10^6/uL": "10*6/uL",
    "cells/uL": "/uL",
    "cells/mm3": "/mm3",
    "IU/L": "[IU]/L",
    "mIU/L": "m[IU]/L",
    "uIU/mL": "u[IU]/mL",
    "µIU/mL": "u[IU]/mL",
    "mIU/mL": "m[IU]/mL",
    "IU/mL": "[IU]/mL",
    "percent": "%",
    "INR": "{INR}",
    "ratio": "1",
    "lb": "[lb_av]",
    "lbs": "[lb_av]",
    "in": "[in_i]",
    "inch": "[in_i]",
    "ft": "[ft_i]",
    "kg/m^2": "kg/m2",
    "kg/m²": "kg/m2",
    "°C": "Cel",
    "degC": "Cel",
    "C": "Cel",
    "°F": "[degF]",
    "degF": "[degF]",
    "F": "[degF]",
    "mmHg": "mm[Hg]",
    "mm Hg": "mm[Hg]",
    "bpm": "/min",
    "beats/min": "/min",
    "{beats}/min": "/min",
    "breaths/min": "/min",
    "{breaths}/min": "/min",
    "mL/min/1.73m2": "mL/min/{1.73_m2}",
    "mL/min/1.73 m2": "mL/min/{1.73_m2}",
    "ml/min/1.73m2": "mL/min/{1.73_m2}",
    "mL/min/1.73m^2": "mL/min/{1.73_m2}",
    "mL/min/1.73_m2": "mL/min/{1.73_m2}",
    "years": "a",
    "year": "a",
    "yr": "a",
    "months": "mo",
    "month": "mo",
    "weeks": "wk",
    "week": "wk",
    "days": "d",
    "day": "d",
    "hours": "h",
    "hour": "h",
}
_FOLDED = {k.lower(): v for k, v in {**{u: u for u in UNITS}, **ALIASES}.items()}

# Molar masses (g/mol) for mass <-> substance concentration, by canonical analyte name (the names
# of configs/fhir/codes.yaml). Urea nitrogen: per mole of N (BUN mg/dL <-> urea mmol/L: 1 mmol/L urea
# carries 28.014 mg of N per litre).
MOLAR_MASS = {
    "creatinine": 113.12,
    "glucose": 180.156,
    "bilirubin": 584.66,
    "cholesterol": 386.65,
    "ldl_cholesterol": 386.65,
    "hdl_cholesterol": 386.65,
    "triglycerides": 885.7,
    "calcium": 40.078,
    "magnesium": 24.305,
    "phosphate": 30.974,
    "uric_acid": 168.11,
    "urea_nitrogen": 28.014,
}


@dataclass(frozen=True)
class Conversion:
    """A value in the wanted unit, with what it came from and by which rule."""

    value: float
    unit: str
    from_value: float
    from_unit: str
    rule: str  # "same unit", "scale", "molar mass 113.12 g/mol", "IFCC-NGSP master equation"

    @property
    def converted(self) -> bool:
        return self.rule != "same unit"

    def describe(self) -> str:
        """'(converted from 106 umol/L)' when a conversion was applied, else ''."""
        return f"(converted from {self.from_value:g} {self.from_unit})" if self.converted else ""


def ucum_code(unit: str | None) -> str:
    """The UCUM code of a unit as written, or UnitConversionError naming it."""
    text = (unit or "").strip()
    if not text:
        raise UnitConversionError("no unit given")
    if text in UNITS:
        return text
    if text in ALIASES:
        return ALIASES[text]
    found = _FOLDED.get(text.lower())
    if found is None:
        raise UnitConversionError(
            f"unknown unit '{text[:40]}' (not in the UCUM table of data_gen/fhir/units.py)"
        )
    return found


def convertible(from_unit: str | None, to_unit: str | None, analyte: str | None = None) -> bool:
    try:
        convert(1.0, from_unit, to_unit, analyte)
    except UnitConversionError:
        return False
    return True


def convert(
    value: float, from_unit: str | None, to_unit: str | None, analyte: str | None = None
) -> Conversion:
    """`value` in `from_unit` as `to_unit`; analyte-specific rules need `analyte` (a canonical name)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UnitConversionError("the value is not a finite number")
    src, dst = UNITS[ucum_code(from_unit)], UNITS[ucum_code(to_unit)]
    if src.code == dst.code:
        return Conversion(float(value), dst.code, float(value), src.code, "same unit")
    if src.dimension == dst.dimension:
        out, rule = _from_base(_to_base(value, src), dst), "scale"
    else:
        out, rule = _across(value, src, dst, analyte)
    if not math.isfinite(out):
        raise UnitConversionError(f"converting to {dst.code} overflows")
    return Conversion(_round(out), dst.code, float(value), src.code, rule)


def _across(value: float, src: Unit, dst: Unit, analyte: str | None) -> tuple[float, str]:
    dims = {src.dimension, dst.dimension}
    if dims == {"mass_concentration", "substance_concentration"}:
        if analyte is None:
            raise UnitConversionError(
                f"{src.code} -> {dst.code} needs the analyte's molar mass, and no analyte is known "
                "(map the code in configs/fhir/codes.yaml)"
            )
        mass = MOLAR_MASS.get(analyte)
        if mass is None:
            raise UnitConversionError(f"{src.code} -> {dst.code}: no molar mass is known for '{analyte}'")
        base = _to_base(value, src)  # g/L or mol/L
        base = base / mass if src.dimension == "mass_concentration" else base * mass
        return _from_base(base, dst), f"molar mass {mass:g} g/mol"
    if dims == {"fraction", "substance_ratio"}:
        if analyte != "hba1c":
            raise UnitConversionError(
                f"{src.code} -> {dst.code} is an analyte-specific conversion (HbA1c NGSP/IFCC); "
                f"analyte is {repr(analyte) if analyte else 'not known'}"
            )
        if src.dimension == "fraction":  # % NGSP -> mmol/mol IFCC
            ngsp = _to_base(value, src) * 100
            return _from_base((ngsp - 2.15) * 10.929 * 1e-3, dst), "IFCC-NGSP master equation"
        ifcc = _to_base(value, src) * 1e3
        return _from_base((ifcc / 10.929 + 2.15) / 100, dst), "IFCC-NGSP master equation"
    raise UnitConversionError(
        f"dimension mismatch: {src.code} is a {src.dimension.replace('_', ' ')}, "
        f"{dst.code} a {dst.dimension.replace('_', ' ')}"
    )


def _to_base(value: float, unit: Unit) -> float:
    return value * unit.factor + unit.offset


def _from_base(base: float, unit: Unit) -> float:
    return (base - unit.offset) / unit.factor


def _round(x: float) -> float:
    if x == 0:
        return 0.0
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}")
