"""UCUM conversions: the table's arithmetic, the analyte rules, and every refusal with its reason."""

import pytest
from verdict.data_gen.fhir.errors import UnitConversionError
from verdict.data_gen.fhir.units import convert, convertible, ucum_code


def test_creatinine_umol_to_mg_by_molar_mass():
    c = convert(106, "µmol/L", "mg/dL", "creatinine")
    assert c.value == pytest.approx(1.199, abs=1e-3)
    assert c.rule == "molar mass 113.12 g/mol" and c.converted
    assert c.describe() == "(converted from 106 umol/L)"
    back = convert(1.2, "mg/dL", "umol/L", "creatinine")
    assert back.value == pytest.approx(106.1, abs=0.05)  # the clinical factor 88.4


def test_glucose_and_mass_prefixes():
    assert convert(5.5, "mmol/L", "mg/dL", "glucose").value == pytest.approx(99.09, abs=0.01)
    assert convert(1.2, "mg/dL", "mg/L").value == pytest.approx(12.0)
    assert convert(35, "g/L", "g/dL").value == pytest.approx(3.5)
    assert convert(150, "10*3/uL", "10*9/L").value == 150.0
    assert convert(150000, "/uL", "10*9/L").value == 150.0


def test_hba1c_ngsp_ifcc_master_equation():
    assert convert(7.0, "%", "mmol/mol", "hba1c").value == pytest.approx(53.0, abs=0.05)
    assert convert(53, "mmol/mol", "%", "hba1c").value == pytest.approx(7.0, abs=0.01)


def test_vitals_affine_and_scales():
    assert convert(98.6, "[degF]", "Cel").value == pytest.approx(37.0)
    assert convert(154, "lb", "kg").value == pytest.approx(69.85, abs=0.01)
    assert convert(120, "mmHg", "mm[Hg]").rule == "same unit"


def test_same_unit_keeps_the_value_exactly():
    c = convert(0.123456789, "mg/dL", "mg/dl")
    assert c.value == 0.123456789 and not c.converted and c.describe() == ""


@pytest.mark.parametrize(
    "args, reason",
    [
        ((1.0, "furlongs/L", "mg/dL"), "unknown unit 'furlongs/L'"),
        ((1.0, "umol/L", "mg/dL"), "needs the analyte's molar mass, and no analyte is known"),
        ((1.0, "g/dL", "mmol/L", "hemoglobin"), "no molar mass is known for 'hemoglobin'"),
        ((7.0, "%", "mmol/mol"), "analyte-specific conversion (HbA1c"),
        ((7.0, "%", "mmol/mol", "creatinine"), "analyte-specific conversion (HbA1c"),
        ((60, "mL/min", "mL/min/{1.73_m2}"), "dimension mismatch"),
        ((1.0, "mg/dL", "kg"), "dimension mismatch"),
        ((float("nan"), "mg/dL", "mg/L"), "not a finite number"),
        ((1.0, None, "mg/L"), "no unit given"),
    ],
)
def test_refusals_give_the_reason(args, reason):
    with pytest.raises(UnitConversionError) as e:
        convert(*args)
    assert reason in str(e.value)


def test_percent_is_never_dimensionally_mmol_per_mol():
    assert not convertible("%", "mmol/mol")
    assert convertible("%", "mmol/mol", "hba1c")


def test_overflow_is_refused():
    with pytest.raises(UnitConversionError, match="overflows"):
        convert(1e308, "g/L", "pg/uL" if False else "ng/L")


def test_aliases_fold_to_ucum():
    assert ucum_code("x10^9/L") == "10*9/L"
    assert ucum_code("MG/DL") == "mg/dL"
    assert ucum_code("mL/min/1.73m2") == "mL/min/{1.73_m2}"
