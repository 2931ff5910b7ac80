"""The site code map: the shipped file loads; a malformed one is refused naming the key."""

import pytest
from verdict.data_gen.fhir.code_map import load_code_map
from verdict.data_gen.fhir.errors import CodeMapError


def test_shipped_code_map_loads_and_looks_up():
    m = load_code_map()
    assert m.lookup("http://loinc.org", "14682-9") == ("analyte", "creatinine")
    assert m.lookup("http://hl7.org/fhir/sid/icd-10", "E11.9") == ("concept", "type_2_diabetes")  # by prefix
    assert m.lookup("http://loinc.org", "0000-0") is None


def test_names_and_not_names():
    m = load_code_map()
    assert m.analytes_named_in("serum creatinine") == ["creatinine"]
    assert m.analytes_named_in("creatinine clearance (Cockcroft-Gault)") == []
    assert m.analytes_named_in("hemoglobin A1c") == ["hba1c"]  # not hemoglobin


def write(tmp_path, text):
    p = tmp_path / "codes.yaml"
    p.write_text(text)
    return p


def test_unknown_key_prefix_unit_and_duplicates_are_named(tmp_path):
    with pytest.raises(CodeMapError, match="unknown config key 'analytes.x.colour'"):
        load_code_map(
            write(
                tmp_path,
                "systems: {loinc: http://loinc.org}\nanalytes:\n  x: {kind: lab, unit: mg/dL,"
                " names: [x], codes: ['loinc:1'], colour: red}\n",
            )
        )
    with pytest.raises(CodeMapError) as e:
        load_code_map(
            write(
                tmp_path,
                "systems: {loinc: http://loinc.org}\nanalytes:\n"
                "  x: {kind: lab, unit: bogons, names: [x], codes: ['lonc:1']}\n"
                "  y: {kind: lab, unit: mg/dL, names: [y], codes: ['loinc:2', 'loinc:2']}\n",
            )
        )
    text = str(e.value)
    assert "analytes.x.codes[0]: 'lonc:1'" in text
    assert "analytes.x.unit: unknown unit 'bogons'" in text
    assert "analytes.y.codes[1]: 'loinc:2' is already mapped to 'y'" in text
