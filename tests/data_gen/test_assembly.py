"""Assembly of per-criterion outputs into one program (data_gen/formalizer/assembly.py): atom
unification with its report, trial-wide definitions, cohorts, failed criteria, conflicts."""

import pytest
from verdict.core.engine import Engine
from verdict.core.program import ParsedCriterion
from verdict.data_gen.formalizer.assembly import assemble, criterion_outputs, unformalized_atom
from verdict.data_gen.formalizer.criteria import CriterionText
from verdict.data_gen.recorded import requirement_outputs

from tests.support import REFERENCE_V6, need

ENGINE = Engine(alternatives=0)  # the caller's engine: assembly has no default one
LARGEST = ["sigir-20147/NCT00602537a", "sigir-201411/NCT00350766"]


def out(formula, *atoms, **kw) -> ParsedCriterion:
    return ParsedCriterion.model_validate({"in_scope": True, "atoms": list(atoms), "formula": formula, **kw})


def atom(name, domain="bool", unit=None, definition=None, **kw) -> dict:
    return {
        "name": name,
        "domain": domain,
        "kind": "other",
        "unit": unit,
        "definition": definition or f"The chart shows {name}.",
        **kw,
    }


def crit(cid: str, text: str = "") -> CriterionText:
    return CriterionText(cid, "inclusion" if cid.startswith("inc") else "exclusion", text or cid)


def reference(name: str):
    need(REFERENCE_V6.is_dir(), "shared reference data")
    from verdict.core.reference import load_reference

    return load_reference(REFERENCE_V6 / f"{name}__full.json")


@pytest.mark.parametrize("name", LARGEST)
def test_round_trip_of_a_large_recorded_program_decides_the_same(name):
    case = reference(name)
    p = case.program
    outs = criterion_outputs(p)
    criteria = [CriterionText(cr.id, side, cr.text) for _, side, cr in p.criteria()]
    asm = assemble(p.trial_id, p.title, criteria, outs, {}, check_satisfiable=ENGINE.check_satisfiable)
    assert asm.program is not None, asm.problems
    q = asm.program
    assert {a.name for a in q.atoms} == {a.name for a in p.atoms}
    assert len(q.definitions) == len(p.definitions)
    engine = Engine(alternatives=0)
    for prog in (p, q):
        engine.check_satisfiable(prog)
    d_p = engine.decide(p, case.patient)
    d_q = engine.decide(q, case.patient.model_copy(update={"program_hash": q.content_hash}))
    assert d_p.decision == d_q.decision
    # an atom two criteria use is one atom, reported as merged, with both as its source
    for m in asm.report["merged"]:
        assert len(m["criteria"]) >= 2 and q.atom_table()[m["atom"]].source_criteria == m["criteria"]


def test_recorded_requirements_assemble_with_merges_reported():
    """The authors' requirements as our per-criterion outputs: shared atoms merge across them."""
    p = reference("sigir-201411/NCT00350766").program
    reqs = requirement_outputs(p)
    assert len(reqs) < len(list(p.criteria()))  # components of one requirement are one criterion
    n = {"inclusion": 0, "exclusion": 0}
    criteria, outs = [], {}
    for r in reqs:
        n[r.side] += 1
        c = CriterionText(f"{r.side[:3]}-{n[r.side]}", r.side, f"{r.side} {r.req}")
        criteria.append(c)
        outs[c.id] = r.output
    asm = assemble(p.trial_id, "", criteria, outs, {}, check_satisfiable=ENGINE.check_satisfiable)
    assert asm.program is not None, asm.problems
    merged = {m["atom"]: m["criteria"] for m in asm.report["merged"]}
    assert merged, "the recorded program shares atoms across requirements"
    for name, ids in merged.items():
        assert len(ids) >= 2 and asm.program.atom_table()[name].source_criteria == ids
        assert all(any(a.name == name for a in outs[i].atoms) for i in ids)  # each declared it
    assert asm.report["renamed"] == []


def test_same_name_other_unit_is_kept_apart_renamed_and_reported():
    outs = {
        "inc-1": out(
            {"op": "cmp", "lhs": "creatinine", "rel": "lt", "rhs": 2}, atom("creatinine", "real", "mg/dL")
        ),
        "inc-2": out(
            {"op": "cmp", "lhs": "Creatinine", "rel": "lt", "rhs": 150}, atom("Creatinine", "real", "umol/L")
        ),
        "exc-1": out(
            {"op": "cmp", "lhs": "creatinine", "rel": "gt", "rhs": 5}, atom("creatinine", "real", "MG/DL ")
        ),
    }
    asm = assemble(
        "T",
        "",
        [crit("inc-1"), crit("inc-2"), crit("exc-1")],
        outs,
        {},
        check_satisfiable=ENGINE.check_satisfiable,
    )
    q = asm.program
    assert [a.name for a in q.atoms] == ["creatinine", "Creatinine__inc-2"]
    assert q.atom_table()["creatinine"].source_criteria == ["inc-1", "exc-1"]
    assert asm.report["merged"] == [{"atom": "creatinine", "criteria": ["inc-1", "exc-1"]}]
    assert asm.report["renamed"] == [
        {
            "atom": "Creatinine",
            "as": "Creatinine__inc-2",
            "criterion": "inc-2",
            "why": "unit 'mg/dL' vs 'umol/L'",
        }
    ]
    assert q.cohorts[0].inclusion[1].formula.lhs == "Creatinine__inc-2"


def test_near_duplicates_are_left_apart_and_reported():
    outs = {
        "inc-1": out({"op": "cmp", "lhs": "age", "rel": "ge", "rhs": 18}, atom("age", "int", "years")),
        "inc-2": out(
            {"op": "cmp", "lhs": "age_years", "rel": "le", "rhs": 75}, atom("age_years", "int", "years")
        ),
        "exc-1": out("is_pregnant", atom("is_pregnant", definition="The patient is pregnant.")),
        "exc-2": out("pregnancy_current", atom("pregnancy_current", definition="The patient is pregnant")),
    }
    asm = assemble("T", "", [crit(c) for c in outs], outs, {}, check_satisfiable=ENGINE.check_satisfiable)
    assert len(asm.program.atoms) == 4
    assert asm.report["near_duplicates"] == [
        {"atoms": ["age", "age_years"], "why": "names equal after dropping prefix/qualifier/unit"},
        {"atoms": ["is_pregnant", "pregnancy_current"], "why": "same definition"},
    ]


def test_trial_wide_definitions_and_local_ones():
    outs = {
        "inc-1": out("has_stroke", atom("has_stroke")),
        "exc-1": out("has_stroke@@within_6_months", atom("has_stroke@@within_6_months")),
        "exc-2": out(
            "bmi_high",
            atom("bmi_high"),
            atom("bmi", "real", "kg/m2"),
            definitions=[
                {
                    "id": "d1",
                    "formula": {
                        "op": "iff",
                        "args": ["bmi_high", {"op": "cmp", "lhs": "bmi", "rel": "gt", "rhs": 35}],
                    },
                }
            ],
        ),
    }
    asm = assemble("T", "", [crit(c) for c in outs], outs, {}, check_satisfiable=ENGINE.check_satisfiable)
    q = asm.program
    assert [d.id for d in q.definitions] == ["exc-2:d1", "qualifier:has_stroke@@within_6_months"]
    assert asm.report["definitions_added"] == ["qualifier:has_stroke@@within_6_months"]
    assert q.definitions[1].kind == "qualifier_implies_stem"


def test_population_labels_make_cohorts():
    outs = {
        "inc-1": out("has_cancer", atom("has_cancer")),
        "inc-2": out("prior_chemo", atom("prior_chemo"), cohorts=["Part B"]),
        "inc-3": out("no_prior_chemo", atom("no_prior_chemo"), cohorts=["Part A"]),
    }
    asm = assemble("T", "", [crit(c) for c in outs], outs, {}, check_satisfiable=ENGINE.check_satisfiable)
    co = {c.id: [cr.id for cr in c.inclusion] for c in asm.program.cohorts}
    assert co == {"part_b": ["inc-1", "inc-2"], "part_a": ["inc-1", "inc-3"]}
    assert [c.label for c in asm.program.cohorts] == ["Part B", "Part A"]


def test_failed_and_out_of_scope_criteria():
    outs = {
        "inc-1": out("has_cancer", atom("has_cancer")),
        "inc-2": ParsedCriterion(in_scope=False, reason="informed consent"),
    }
    criteria = [
        crit("inc-1"),
        crit("inc-2", "Signed consent"),
        crit("exc-1", "Serious illness that would interfere"),
    ]
    asm = assemble("T", "", criteria, outs, {"exc-1": "schema"}, check_satisfiable=ENGINE.check_satisfiable)
    q = asm.program
    assert asm.report["out_of_scope"] == [{"id": "inc-2", "reason": "informed consent"}]
    assert asm.report["unformalized"] == [{"id": "exc-1", "reason": "schema"}]
    name = unformalized_atom(criteria[2])
    assert name == "criterion_exc_1_unformalized"
    assert q.cohorts[0].exclusion[0].formula == name
    assert "Serious illness that would interfere" in q.atom_table()[name].definition
    assert [cr.id for _, _, cr in q.criteria()] == ["inc-1", "exc-1"]


def test_conflicting_criteria_are_named():
    age = atom("age_years", "int", "years")
    outs = {
        "inc-1": out({"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": 18}, age),
        "inc-2": out("has_cancer", atom("has_cancer")),
        "inc-3": out({"op": "cmp", "lhs": "age_years", "rel": "lt", "rhs": 12}, age),
    }
    engine = Engine(alternatives=0)
    asm = assemble("T", "", [crit(c) for c in outs], outs, {}, check_satisfiable=engine.check_satisfiable)
    assert asm.program is None and asm.report["conflict"] == ["inc-1", "inc-3"]
    assert ("unsatisfiable", "criteria in conflict: inc-1, inc-3") in asm.problems


def test_nothing_in_scope_is_a_clear_problem():
    outs = {"inc-1": ParsedCriterion(in_scope=False, reason="consent")}
    asm = assemble("T", "", [crit("inc-1")], outs, {}, check_satisfiable=ENGINE.check_satisfiable)
    assert asm.program is None and asm.problems[0][0] == "program" and "1 out of scope" in asm.problems[0][1]


def test_a_trial_whose_every_criterion_failed_is_rejected():
    criteria = [crit("inc-1"), crit("exc-1")]
    asm = assemble(
        "T",
        "",
        criteria,
        {},
        {"inc-1": "undeclared_atom", "exc-1": "schema"},
        check_satisfiable=ENGINE.check_satisfiable,
    )
    assert asm.program is None
    assert [c for c, _ in asm.problems] == ["undeclared_atom", "schema"]
    assert asm.report["unformalized"] == [
        {"id": "inc-1", "reason": "undeclared_atom"},
        {"id": "exc-1", "reason": "schema"},
    ]
