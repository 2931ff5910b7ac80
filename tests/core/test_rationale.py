from verdict.core.engine import Engine
from verdict.core.rationale import rationale_json, render_markdown

from .helpers import atom, patient, program


def test_rationale_restates_the_decision_with_evidence_and_requirements():
    atoms = [atom("dx"), atom("preg", kind="demographic"), atom("creat", "real", "lab_value", unit="mg/dL")]
    prog = program(
        ["dx", {"op": "cmp", "lhs": "creat", "rel": "le", "rhs": 2.0}], exclusion=["preg"], atoms=atoms
    )
    p = patient(prog, dx=True, creat=3.4)
    d = Engine().decide(prog, p)
    md = render_markdown(prog, p, d)
    assert "**INELIGIBLE**" in md
    assert '"dx is True"' in md  # evidence quote
    assert "creat <= 2.0 mg/dL (now 3.4" in md  # the trial's requirement, not a witness value
    js = rationale_json(prog, p, d)
    assert js["decision"] == "ineligible"
    assert {c["criterion"]: c["label"] for c in js["criteria"]} == {
        "inc0": "satisfied",
        "inc1": "violated",
        "exc0": "deferred",
    }
    assert js["would_change"][0]["atom"] == "creat"
    p2 = patient(prog, dx=True, creat=1.0)
    md2 = render_markdown(prog, p2, Engine().decide(prog, p2))
    assert "To confirm at the screening visit" in md2 and "must be absent" in md2


def test_markup_from_criteria_definitions_and_notes_is_inert_in_the_markdown():
    from verdict.core.patient import MinedValue
    from verdict.core.policy import load_policy, resolve

    atoms = [atom("dx"), atom("age", "int", "demographic")]
    atoms[0]["definition"] = "Has <b>dx</b>"
    prog = program(["dx", {"op": "cmp", "lhs": "age", "rel": "ge", "rhs": 18}], atoms=atoms)
    prog = prog.model_copy(deep=True)
    prog.cohorts[0].inclusion[0].text = "Diagnosis <script>alert(1)</script> [click](javascript:x)"
    quote = "<img src=x onerror=alert(1)> ![p](http://evil.example/p.png)"
    mined = [
        MinedValue(atom="dx", value=True, evidence=quote),
        MinedValue(atom="age", value=40, evidence="40 & up"),
    ]
    p = resolve(prog, "p1", mined, load_policy("prescreen"))
    md = render_markdown(prog, p, Engine().decide(prog, p))
    assert "<script" not in md and "<img" not in md and "<b>" not in md
    assert "](" not in md.replace("\\](", "")  # no link or image syntax survives
    assert "&lt;script&gt;" in md and "&lt;img src=x onerror=alert(1)&gt;" in md and "40 &amp; up" in md
