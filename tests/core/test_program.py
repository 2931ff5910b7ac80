import pytest

from verdict_core.engine import Engine
from verdict_core.errors import ProgramError
from verdict_core.program import load_program

from .helpers import atom, program


def test_undeclared_atom_is_named_with_its_location():
    with pytest.raises(ProgramError) as e:
        program(["a", {"op": "or", "args": ["b", "zz"]}])
    assert "undeclared atom 'zz'" in str(e.value)
    assert "cohorts[0].inclusion[1]" in str(e.value)


def test_type_errors_are_reported():
    atoms = [atom("a"), atom("age", "int", "demographic")]
    with pytest.raises(ProgramError) as e:
        program(["age", {"op": "cmp", "lhs": "a", "rel": "ge", "rhs": 3}], atoms=atoms)
    msg = str(e.value)
    assert "'age' is int but is used as a condition" in msg
    assert "'a' is bool but is used as a number" in msg


def test_duplicate_ids_and_names():
    with pytest.raises(ProgramError) as e:
        program(["a"], atoms=[atom("a"), atom("a")])
    assert "duplicate atom name 'a'" in str(e.value)
    with pytest.raises(ProgramError) as e:
        program([], cohorts=[{"id": "x", "inclusion": [{"id": "i", "text": "", "formula": "a"}] * 2}], atoms=[atom("a")])
    assert "duplicate id 'i'" in str(e.value)


def test_structural_errors_name_the_field():
    with pytest.raises(ProgramError) as e:
        load_program({"trial_id": "T", "atoms": [{"name": "a", "domain": "text", "kind": "diagnosis", "definition": "x"}],
                      "cohorts": [{"id": "c", "inclusion": [{"id": "i", "text": "", "formula": {"op": "xor", "args": []}}]}]})
    msg = str(e.value)
    assert "atoms.0.domain" in msg
    assert "formula" in msg
    with pytest.raises(ProgramError) as e:
        load_program('{"trial_id": "T", "atoms": [}')
    assert "invalid trial program" in str(e.value)


def test_unknown_keys_are_refused():
    with pytest.raises(ProgramError) as e:
        load_program({"trial_id": "T", "atoms": [atom("a")], "cohorts": [{"id": "c", "inclusion": [
            {"id": "i", "text": "", "formula": "a", "weight": 2}]}]})
    assert "weight" in str(e.value)


def test_content_hash_tracks_semantic_content_only():
    p1 = program(["a"])
    p2 = load_program({**p1.model_dump(by_alias=True), "title": "another title", "content_hash": None})
    assert p1.content_hash == p2.content_hash
    p3 = program(["b"])
    assert p3.content_hash != p1.content_hash
    with pytest.raises(ProgramError) as e:
        load_program({**p1.model_dump(by_alias=True), "content_hash": p3.content_hash})
    assert "edited after hashing" in str(e.value)


def test_unsatisfiable_program_is_refused_with_the_culprit():
    prog = program(["a", {"op": "not", "arg": "a"}])
    with pytest.raises(ProgramError) as e:
        Engine().check_satisfiable(prog)
    assert "cohort 'main'" in str(e.value)
    never = program([{"op": "and", "args": ["b", {"op": "not", "arg": "b"}]}])
    with pytest.raises(ProgramError) as e:
        Engine().check_satisfiable(never)
    assert "main/inc0" in str(e.value)
    Engine().check_satisfiable(program(["a", "b"]))  # a satisfiable one passes


def test_definitions_are_trial_wide_and_checked():
    atoms = [atom("q"), atom("s")]
    prog = program(["q"], atoms=atoms, definitions=[{"id": "d", "kind": "qualifier_implies_stem",
                                                      "formula": {"op": "implies", "if": "q", "then": "s"}}])
    assert prog.atom_sides()["s"] == {"inclusion"}  # a stem takes the side of its qualifier
    with pytest.raises(ProgramError):
        program(["q"], atoms=atoms, definitions=[{"id": "d", "formula": {"op": "implies", "if": "q", "then": "nope"}}])


def test_time_scope_needs_amount_for_windows():
    with pytest.raises(ProgramError) as e:
        program(["a"], atoms=[atom("a", time_scope={"kind": "within"})])
    assert "needs both amount and unit" in str(e.value)
