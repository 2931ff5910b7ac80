import pytest
from verdict.core.engine import Engine
from verdict.core.errors import PatientError
from verdict.core.patient import Bounds, ResolvedPatient, check_patient, load_patient

from .helpers import atom, patient, program

AGE = [atom("a"), atom("age", "int", "demographic")]


def test_value_of_the_wrong_type_is_named():
    prog = program(["a"], atoms=AGE)
    with pytest.raises(PatientError) as e:
        patient(prog, a=3)
    assert "'a'" in str(e.value) and "not a boolean" in str(e.value)
    with pytest.raises(PatientError) as e:
        patient(prog, age=True)
    assert "is a boolean but the atom domain is int" in str(e.value)
    with pytest.raises(PatientError) as e:
        patient(prog, age=3.5)
    assert "not an integer" in str(e.value)


def test_patient_for_another_program_version_is_refused():
    prog = program(["a"], atoms=AGE)
    other = program(["a", {"op": "cmp", "lhs": "age", "rel": "ge", "rhs": 18}], atoms=AGE)
    p = patient(prog, a=True)
    with pytest.raises(PatientError) as e:
        Engine().decide(other, p)
    assert "program_hash" in str(e.value) and "re-run the value miner" in str(e.value)
    with pytest.raises(PatientError) as e:
        check_patient(program(["a"], atoms=AGE, trial_id="T2"), p)
    assert "trial 'T1'" in str(e.value)


def test_undeclared_and_duplicate_atoms():
    prog = program(["a"], atoms=AGE)
    p = patient(prog, a=True)
    bad = p.model_copy(update={"resolutions": p.resolutions + [p.resolutions[0]]})
    with pytest.raises(PatientError) as e:
        check_patient(prog, bad)
    assert "duplicate resolution" in str(e.value)
    with pytest.raises(PatientError) as e:
        patient(prog, zz=True)
    assert "'zz': not an atom" in str(e.value)


def test_resolution_consistency_rules():
    with pytest.raises(PatientError) as e:
        load_patient(
            {
                "patient_id": "p",
                "trial_id": "T",
                "program_hash": "x",
                "resolutions": [{"atom": "a", "status": "unresolved", "value": True}],
            }
        )
    assert "unresolved atom has no value" in str(e.value)
    with pytest.raises(PatientError) as e:
        load_patient(
            {
                "patient_id": "p",
                "trial_id": "T",
                "program_hash": "x",
                "resolutions": [{"atom": "a", "status": "imputed", "value": True}],
            }
        )
    assert "imputation record" in str(e.value)
    with pytest.raises(ValueError):
        Bounds(lo=3, hi=1)
    assert Bounds(lo=1, hi=3, hi_strict=True).contains(2.9) and not Bounds(
        lo=1, hi=3, hi_strict=True
    ).contains(3)
    assert isinstance(
        load_patient('{"patient_id": "p", "trial_id": "T", "program_hash": "x", "resolutions": []}'),
        ResolvedPatient,
    )


@pytest.mark.parametrize(
    "value",
    [10**400, 10**15 + 1, -(10**16), float("inf"), float("nan")],
    ids=["10**400", "10**15+1", "-10**16", "inf", "nan"],
)
def test_numbers_beyond_the_range_are_a_type_problem_of_the_miner_output(value):
    from verdict.core.patient import value_type_problems

    (problem,) = value_type_problems("int" if isinstance(value, int) else "real", value, None)
    assert problem.startswith("value: ") and ("finite" in problem or "NaN" in problem)
    assert len(problem) < 200  # 10**400 is not echoed digit by digit
    prog = program(["a", {"op": "cmp", "lhs": "age", "rel": "ge", "rhs": 18}], atoms=AGE)
    if isinstance(value, int):
        with pytest.raises(PatientError, match="too large"):
            patient(prog, a=True, age=value)


def test_numbers_at_the_edge_of_the_range_are_values():
    from verdict.core.patient import value_type_problems

    assert value_type_problems("int", 10**15, None) == [] and value_type_problems("real", -1e15, None) == []
    assert value_type_problems("real", None, Bounds(lo=-1e15, hi=1e15)) == []
    assert value_type_problems("real", None, Bounds(lo=2e15))[0].startswith("bounds.lo: ")
