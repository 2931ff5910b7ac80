from verdict_core.engine import Engine
from verdict_core.rationale import rationale_json, render_markdown

from .helpers import atom, patient, program


def test_rationale_restates_the_decision_with_evidence_and_requirements():
    atoms = [atom("dx"), atom("preg", kind="demographic"), atom("creat", "real", "lab_value", unit="mg/dL")]
    prog = program(["dx", {"op": "cmp", "lhs": "creat", "rel": "le", "rhs": 2.0}], exclusion=["preg"], atoms=atoms)
    p = patient(prog, dx=True, creat=3.4)
    d = Engine().decide(prog, p)
    md = render_markdown(prog, p, d)
    assert "**INELIGIBLE**" in md
    assert '"dx is True"' in md  # evidence quote
    assert "creat <= 2.0 mg/dL (now 3.4" in md  # the trial's requirement, not a witness value
    js = rationale_json(prog, p, d)
    assert js["decision"] == "ineligible"
    assert {c["criterion"]: c["label"] for c in js["criteria"]} == {"inc0": "satisfied", "inc1": "violated", "exc0": "deferred"}
    assert js["would_change"][0]["atom"] == "creat"
    p2 = patient(prog, dx=True, creat=1.0)
    md2 = render_markdown(prog, p2, Engine().decide(prog, p2))
    assert "To confirm at the screening visit" in md2 and "must be absent" in md2
