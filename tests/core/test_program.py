import pytest
from verdict.core.engine import Engine
from verdict.core.errors import ProgramError
from verdict.core.program import load_program

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
        program(
            [],
            cohorts=[{"id": "x", "inclusion": [{"id": "i", "text": "", "formula": "a"}] * 2}],
            atoms=[atom("a")],
        )
    assert "duplicate id 'i'" in str(e.value)


def test_structural_errors_name_the_field():
    with pytest.raises(ProgramError) as e:
        load_program(
            {
                "trial_id": "T",
                "atoms": [{"name": "a", "domain": "text", "kind": "diagnosis", "definition": "x"}],
                "cohorts": [
                    {"id": "c", "inclusion": [{"id": "i", "text": "", "formula": {"op": "xor", "args": []}}]}
                ],
            }
        )
    msg = str(e.value)
    assert "atoms.0.domain" in msg
    assert "formula" in msg
    with pytest.raises(ProgramError) as e:
        load_program('{"trial_id": "T", "atoms": [}')
    assert "invalid trial program" in str(e.value)


def test_unknown_keys_are_refused():
    with pytest.raises(ProgramError) as e:
        load_program(
            {
                "trial_id": "T",
                "atoms": [atom("a")],
                "cohorts": [{"id": "c", "inclusion": [{"id": "i", "text": "", "formula": "a", "weight": 2}]}],
            }
        )
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
    prog = program(
        ["q"],
        atoms=atoms,
        definitions=[
            {
                "id": "d",
                "kind": "qualifier_implies_stem",
                "formula": {"op": "implies", "if": "q", "then": "s"},
            }
        ],
    )
    assert prog.atom_sides()["s"] == {"inclusion"}  # a stem takes the side of its qualifier
    with pytest.raises(ProgramError):
        program(
            ["q"],
            atoms=atoms,
            definitions=[{"id": "d", "formula": {"op": "implies", "if": "q", "then": "nope"}}],
        )


def test_time_scope_needs_amount_for_windows():
    with pytest.raises(ProgramError) as e:
        program(["a"], atoms=[atom("a", time_scope={"kind": "within"})])
    assert "needs both amount and unit" in str(e.value)


# ---- bounded nesting and numbers (issue 11, items 4 and 5) ----------------------------------------
from verdict.core.formula import MAX_DEPTH, MAX_MAGNITUDE, nesting_depth  # noqa: E402

LAB = [atom("a"), atom("x", "real", "lab_value")]


def deep(depth: int, kind: str):
    """A formula exactly ``depth`` operator levels deep, through formulas or through terms."""
    if kind == "not":
        f = "a"
        for _ in range(depth):
            f = {"op": "not", "arg": f}
        return f
    if kind == "and":
        f = {"op": "cmp", "lhs": "x", "rel": "le", "rhs": 2.0}
        for _ in range(depth - 1):
            f = {"op": "and", "args": [f, "a"]}
        return f
    t = "x"  # terms: (((x + 1) + 1) ...) <= 2
    for _ in range(depth - 1):
        t = {"op": "add", "args": [t, 1]}
    return {"op": "cmp", "lhs": t, "rel": "le", "rhs": 2.0}


@pytest.mark.parametrize("kind", ["not", "and", "term"])
def test_a_program_at_the_nesting_bound_round_trips_and_one_past_is_refused(kind):
    prog = program([deep(MAX_DEPTH, kind)], atoms=LAB)
    assert nesting_depth(prog.cohorts[0].inclusion[0].formula)[0] == MAX_DEPTH
    again = load_program(prog.model_dump_json(by_alias=True))  # what the store does on every read
    assert again.content_hash == prog.content_hash
    for where in ("inclusion", "definition"):
        with pytest.raises(ProgramError) as e:
            if where == "inclusion":
                program([deep(MAX_DEPTH + 1, kind)], atoms=LAB)
            else:
                program(["a"], atoms=LAB, definitions=[{"id": "d", "formula": deep(MAX_DEPTH + 1, kind)}])
        assert f"formula nested deeper than {MAX_DEPTH} levels" in str(e.value)
        assert ("inclusion.0.formula" if where == "inclusion" else "definitions.0.formula") in str(e.value)
    with pytest.raises(ProgramError, match="nested deeper"):  # the same bound on read
        body = prog.model_dump(by_alias=True)
        body["cohorts"][0]["inclusion"][0]["formula"] = deep(MAX_DEPTH + 1, kind)
        load_program(__import__("json").dumps(body))


def test_hostile_nesting_is_refused_cheaply_without_recursion():
    with pytest.raises(ProgramError, match="nested deeper"):
        program([deep(20_000, "not")], atoms=LAB)


@pytest.mark.parametrize(
    "rhs",
    [10**400, float("nan"), float("inf"), -float("inf"), MAX_MAGNITUDE * (1 + 1e-15), 10**15 + 1],
    ids=["10**400", "nan", "inf", "-inf", "just-above-1e15", "10**15+1"],
)
def test_numbers_beyond_the_range_are_validation_problems_naming_the_field(rhs):
    with pytest.raises(ProgramError) as e:
        program([{"op": "cmp", "lhs": "x", "rel": "le", "rhs": rhs}], atoms=LAB)
    (problem,) = e.value.problems  # one clear problem, not one per union alternative
    assert problem.startswith("cohorts.0.inclusion.0.formula.cmp.rhs: ")
    assert "finite" in problem or "NaN" in problem


@pytest.mark.parametrize("rhs", [MAX_MAGNITUDE, -MAX_MAGNITUDE, 10**15, -(10**15), 0, 1e-300])
def test_numbers_at_the_edge_of_the_range_are_accepted_and_decided(rhs):
    prog = program([{"op": "cmp", "lhs": "x", "rel": "le", "rhs": rhs}], atoms=LAB)
    Engine().check_satisfiable(prog)
