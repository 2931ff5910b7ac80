import pytest
from verdict.core.engine import Engine
from verdict.core.errors import PolicyError, VerdictError
from verdict.core.policy import Policy, apply_policy, load_policy, resolve

from .helpers import atom, patient, program

ATOMS = [
    atom("dx"),
    atom("nodx"),
    atom("preg", kind="demographic"),
    atom("creat", "real", "lab_value", unit="mg/dL"),
    atom("a1c", "real", "lab_value", unit="%"),
]
PROG = program(
    [
        "dx",
        {"op": "not", "arg": "nodx"},
        {"op": "cmp", "lhs": "creat", "rel": "le", "rhs": 2.0},
        {
            "op": "and",
            "args": [
                {"op": "cmp", "lhs": "a1c", "rel": "ge", "rhs": 7},
                {"op": "cmp", "lhs": "a1c", "rel": "le", "rhs": 10.5},
            ],
        },
    ],
    exclusion=["preg"],
    atoms=ATOMS,
)


def test_prescreen_leaves_silence_open():
    p = patient(PROG, "prescreen")
    assert all(r.status == "unresolved" for r in p.resolutions)
    assert Engine().decide(PROG, p).decision == "eligible"


def test_strict_imputes_not_established_per_side_and_polarity():
    p = patient(PROG, "strict").by_atom()
    assert (p["dx"].status, p["dx"].value) == ("imputed", False)  # required finding: not met
    assert p["dx"].imputation.rule == "inclusion-not-documented"
    assert (p["nodx"].value) is True  # "no nodx" required: the absence is not established either
    assert (p["preg"].value, p["preg"].imputation.rule) == (False, "exclusion-not-documented")
    assert p["creat"].bounds.lo == 2.0 and p["creat"].bounds.lo_strict  # creat <= 2 not met
    assert p["a1c"].status == "unresolved" and "no single interval" in p["a1c"].note
    d = Engine().decide(PROG, patient(PROG, "strict"))
    assert d.decision == "ineligible"
    assert {lb.criterion for lb in d.labels if lb.label == "violated"} == {"inc0", "inc1", "inc2"}


def test_observed_values_are_never_overridden_by_a_policy():
    p = patient(PROG, "strict", dx=True)
    assert p.by_atom()["dx"].status == "observed"
    again = apply_policy(PROG, p, load_policy("strict"))
    assert again == p


def test_sides_that_disagree_leave_the_atom_open():
    prog = program(
        ["shared"],
        exclusion=[{"op": "and", "args": ["shared", "other"]}],
        atoms=[atom("shared"), atom("other")],
    )
    p = patient(prog, "exclusion-absent").by_atom()
    assert p["shared"].status == "unresolved" and "disagree across sides" in p["shared"].note
    assert (p["other"].status, p["other"].value) == ("imputed", False)


def test_overrides_and_first_matching_rule():
    pol = Policy.model_validate(
        {
            "name": "site",
            "version": "3",
            "rules": [
                {
                    "id": "labs-open",
                    "match": {"kinds": ["lab_value"]},
                    "action": "unresolved",
                    "reason": "labs at visit",
                },
                {
                    "id": "rest-false",
                    "action": "impute",
                    "value": False,
                    "reason": "absent unless documented",
                },
            ],
            "overrides": {"nodx": {"action": "impute", "value": True, "reason": "site rule"}},
        }
    )
    p = resolve(PROG, "p", [], pol).by_atom()
    assert p["creat"].status == "unresolved"
    assert p["dx"].value is False and p["dx"].imputation.rule == "rest-false"
    assert p["nodx"].value is True and p["nodx"].imputation.rule == "override:nodx"
    assert p["dx"].imputation.policy_version == "3"
    assert resolve(PROG, "p", [], pol) == resolve(PROG, "p", [], pol)  # deterministic


def test_bad_policies_are_named(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: bad\nversion: '1'\nrules:\n  - id: r\n    action: impute\n    reason: x\n")
    with pytest.raises(PolicyError) as e:
        load_policy(str(f))
    assert "needs a value" in str(e.value)
    f.write_text("name: [unclosed\n")
    with pytest.raises(PolicyError) as e:
        load_policy(str(f))
    assert "not valid YAML" in str(e.value)
    with pytest.raises(VerdictError) as e:
        load_policy("no-such-policy")
    assert "prescreen" in str(e.value) and "strict" in str(e.value)
