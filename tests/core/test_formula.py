import json

import pytest
from pydantic import TypeAdapter, ValidationError
from verdict.core.formula import Formula, atoms_in, evaluate, polarities, render, simple_comparisons
from verdict.core.schemas import SCHEMAS, json_schema

F = TypeAdapter(Formula)


def test_compact_json_round_trips_and_renders():
    data = {
        "op": "and",
        "args": [
            "a",
            {"op": "cmp", "lhs": "creat", "rel": "le", "rhs": 2.0},
            {"op": "implies", "if": "b", "then": {"op": "not", "arg": "c"}},
        ],
    }
    f = F.validate_python(data)
    assert json.loads(F.dump_json(f, by_alias=True)) == data
    assert render(f) == "a and creat <= 2.0 and (if b then not c)"
    assert atoms_in(f) == {"a", "creat", "b", "c"}
    assert evaluate(f, {"a": True, "creat": 1.5, "b": False, "c": True}) is True


def test_structure_is_strict():
    for bad in (
        {"op": "and", "args": []},
        {"op": "cmp", "lhs": "x", "rel": "<=", "rhs": 1},
        {"op": "not", "arg": "a", "extra": 1},
        {"op": "iff", "args": ["a"]},
        "1bad name",
        {"op": "cmp", "lhs": "x", "rel": "le", "rhs": True},
    ):
        with pytest.raises(ValidationError):
            F.validate_python(bad)


def test_polarity_and_comparisons():
    f = F.validate_python(
        {
            "op": "implies",
            "if": "a",
            "then": {"op": "not", "arg": {"op": "cmp", "lhs": 2, "rel": "lt", "rhs": "x"}},
        }
    )
    assert polarities(f) == {"a": {"-"}, "x": {"+", "-"}}  # comparisons push both ways
    assert list(simple_comparisons(f)) == [("x", "gt", 2.0, False)]


def test_schemas_export_and_cover_the_formula_language():
    for name in SCHEMAS:
        schema = json_schema(name)
        assert schema["type"] == "object"
        json.dumps(schema)
    text = json.dumps(json_schema("parsed-trial"))
    for op in ("cmp", "at_least", "implies", "count", "ite"):
        assert f'"{op}"' in text
