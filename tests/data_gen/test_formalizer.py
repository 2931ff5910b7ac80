"""The formalizer stage: structured output, strict checks with verdict_core, one repair, rejection."""

import asyncio
import json

import pytest

from data_gen.cache import CallCache
from data_gen.formalizer import Formalizer, quote_in_note, side_atoms
from data_gen.protocol import PatientDoc
from data_gen.scripted_server import Match, Rule, Script
from data_gen.scripted_server import ScriptedResponse as R
from data_gen.teacher_config import TeacherConfig
from verdict_core.patient import ValueMinerOutput
from verdict_core.program import ParsedTrial, TrialProgram, check_program

from .teacher_data import bad_program, patient, program, trial, trial_id


def teacher(url, **over):
    cfg = dict(name="t", base_url=url, model="m", timeout_s=5, backoff_base_s=0.01, max_retries=2,
               prices={"input_per_million": 1.0, "output_per_million": 2.0})
    cfg.update(over)
    return TeacherConfig(**cfg)


def run(coro_fn, t, **kw):
    async def go():
        fz = Formalizer(t, **kw)
        try:
            return await coro_fn(fz)
        finally:
            await fz.aclose()

    return asyncio.run(go())


def parse(url, i=0, **kw):
    return run(lambda fz: fz.parse_trial(trial(i)), teacher(url), **kw)


def set_answers(srv, *responses, repair=None):
    rules = []
    if repair is not None:
        rules.append(Rule(match=Match(contains=["rejected by the checker"]), responses=list(repair)))
    rules.append(Rule(responses=list(responses)))
    srv.set_script(Script(rules=rules))


def test_accepts_a_valid_program(scripted_server):
    set_answers(scripted_server, R(content=program(0)))
    res = parse(scripted_server.url)
    assert res.status == "accepted" and not res.repaired and len(res.attempts) == 1
    assert isinstance(res.output, TrialProgram) and res.output.trial_id == trial_id(0)
    check_program(res.output)
    # the training target: compact JSON that is itself a valid ParsedTrial
    assert " " not in res.output_json.split('"definition"')[0]
    assert ParsedTrial.model_validate_json(res.output_json).model_dump() == ParsedTrial.model_validate(program(0)).model_dump()
    assert [m["role"] for m in res.messages] == ["system", "user"] and trial_id(0) in res.messages[1]["content"]
    body = scripted_server.requests[0].body
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["atoms", "cohorts"]
    assert res.usage.calls_paid == 1 and res.usage.cost_usd > 0


def test_repair_with_the_problems_fed_back(scripted_server):
    set_answers(scripted_server, R(content=bad_program(0)), repair=[R(content=program(0))])
    res = parse(scripted_server.url)
    assert res.status == "accepted" and res.repaired
    assert [a.reason for a in res.attempts] == ["undeclared_atom", None]
    repair = scripted_server.requests[1].body["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert json.loads(repair[2]["content"]) == bad_program(0)  # its own previous output
    assert "undeclared atom 'is_pregnant_now'" in repair[3]["content"]
    assert res.messages == repair[:2]  # the record keeps the original prompt, not the repair turn


@pytest.mark.parametrize("answer, reason", [
    (R(content=bad_program(0)), "undeclared_atom"),
    (R(content={"atoms": []}), "schema"),
    (R(content=program(0), fault="truncated"), "truncated"),
    (R(content=program(0), fault="malformed_content"), "json"),
    (R(content=""), "empty"),
])
def test_rejected_after_one_repair(scripted_server, answer, reason):
    set_answers(scripted_server, answer)
    res = parse(scripted_server.url)
    assert res.status == "rejected" and res.reason == reason and res.problems
    assert res.output is None and res.output_json is None
    assert len(scripted_server.requests) == 2  # the output and exactly one repair


def test_unsatisfiable_program_is_rejected(scripted_server):
    p = program(0)
    p["cohorts"][0]["inclusion"].append({"id": "inc3", "text": "Children under 10",
                                         "formula": {"op": "cmp", "lhs": "age_years", "rel": "lt", "rhs": 10}})
    set_answers(scripted_server, R(content=p))
    res = parse(scripted_server.url)
    assert res.status == "rejected" and res.reason == "unsatisfiable"
    assert any("contradict" in x or "never be met" in x for x in res.problems)


def test_type_errors_in_formulas_are_rejected(scripted_server):
    p = program(0)
    p["cohorts"][0]["inclusion"][1]["formula"] = "age_years"  # a number used as a condition
    set_answers(scripted_server, R(content=p))
    res = parse(scripted_server.url)
    assert res.status == "rejected" and res.reason == "program"


def test_identical_call_is_never_paid_twice(scripted_server, tmp_path):
    set_answers(scripted_server, R(content=bad_program(0)), repair=[R(content=program(0))])
    cache = CallCache(tmp_path / "c.sqlite")
    first = parse(scripted_server.url, cache=cache)
    second = parse(scripted_server.url, cache=cache)
    assert len(scripted_server.requests) == 2
    assert [a.cached for a in second.attempts] == [True, True] and second.usage.calls_paid == 0
    assert second.output_json == first.output_json and second.status == "accepted"


# ---- value miner ------------------------------------------------------------------------------------
@pytest.fixture
def prog():
    return check_program(TrialProgram(trial_id=trial_id(1), **program(1)))


NOTE = patient(1)  # "A 37-year-old man with chest pain ... Known condition 1; he denies smoking. ..."


def mine(url, prog, side, *responses, repair=None, srv=None, **kw):
    set_answers(srv, *responses, repair=repair)
    return run(lambda fz: fz.mine_values(prog, NOTE, side), teacher(url), **kw)


def test_side_atoms(prog):
    assert side_atoms(prog, "inclusion") == ["age_years", "has_condition_1"]
    assert side_atoms(prog, "exclusion") == ["is_pregnant"]


def test_miner_accepts_verbatim_evidence(scripted_server, prog):
    answer = {"values": [{"atom": "has_condition_1", "value": True, "evidence": "Known  condition 1"},
                         {"atom": "age_years", "value": 37, "evidence": "A 37-year-old man"}]}
    res = mine(scripted_server.url, prog, "inclusion", R(content=answer), srv=scripted_server)
    assert res.status == "accepted", res.problems
    # canonical target: the prompt's atom order, compact, nulls without evidence
    assert json.loads(res.output_json)["values"][0]["atom"] == "age_years"
    ValueMinerOutput.model_validate_json(res.output_json)
    body = scripted_server.requests[0].body
    user = body["messages"][1]["content"]
    assert NOTE.text.split(".")[0] in user and "has_condition_1" in user and "is_pregnant" not in user
    # the schema sent restricts atom names to the pass's atoms
    enum = body["response_format"]["json_schema"]["schema"]["$defs"]["MinedValue"]["properties"]["atom"]["enum"]
    assert enum == ["age_years", "has_condition_1"]


NULL_COND = {"atom": "has_condition_1", "value": None, "evidence": ""}


@pytest.mark.parametrize("values, reason", [
    ([{"atom": "age_years", "value": 37, "evidence": "a 37-year-old woman"}, NULL_COND], "evidence"),
    ([{"atom": "age_years", "value": 37, "evidence": ""}, NULL_COND], "evidence"),
    ([{"atom": "age_years", "value": True, "evidence": "A 37-year-old man"}, NULL_COND], "type"),
    ([{"atom": "age_years", "value": 37.5, "evidence": "A 37-year-old man"}, NULL_COND], "type"),
    ([{"atom": "age_years", "value": None, "evidence": ""}], "coverage"),  # has_condition_1 missing
    ([{"atom": "age_years", "value": None}, NULL_COND, NULL_COND], "coverage"),  # reported twice
    ([{"atom": "age_years", "value": None}, NULL_COND, {"atom": "is_pregnant", "value": None}], "coverage"),  # not asked
    ([{"atom": "age_years", "value": None}, NULL_COND, {"atom": "smoker", "value": False, "evidence": "he denies smoking"}],
     "undeclared_atom"),
])
def test_miner_rejections(scripted_server, prog, values, reason):
    res = mine(scripted_server.url, prog, "inclusion", R(content={"values": values}), srv=scripted_server)
    assert res.status == "rejected" and res.reason == reason, res.problems
    assert not any("37-year-old" in p for p in res.problems)  # problems never quote the note


def test_miner_repair_fixes_evidence(scripted_server, prog):
    bad = {"values": [{"atom": "is_pregnant", "value": False, "evidence": "he is not pregnant"}]}
    good = {"values": [{"atom": "is_pregnant", "value": None, "evidence": ""}]}
    res = mine(scripted_server.url, prog, "exclusion", R(content=bad), repair=[R(content=good)], srv=scripted_server)
    assert res.status == "accepted" and res.repaired and res.attempts[0].reason == "evidence"
    assert json.loads(res.output_json) == {"values": [{"atom": "is_pregnant", "value": None}]}


def test_bounds_need_evidence_too(scripted_server, prog):
    ans = {"values": [{"atom": "age_years", "value": None, "bounds": {"lo": 18}, "evidence": "A 37-year-old man"},
                      {"atom": "has_condition_1", "value": None, "evidence": ""}]}
    res = mine(scripted_server.url, prog, "inclusion", R(content=ans), srv=scripted_server)
    assert res.status == "accepted", res.problems


@pytest.mark.parametrize("quote, ok", [
    ("chest pain radiating to the left arm", True),
    ("chest pain\n  radiating   to the left arm", True),
    ('"he denies smoking"', True),
    ("A 37-year-old man ... he denies smoking", True),
    ("he denies smoking ... A 37-year-old man", False),  # pieces must keep the note's order
    ("chest pains", False),
    ("", False),
])
def test_quote_in_note(quote, ok):
    assert quote_in_note(quote, NOTE.text) is ok


# ---- arbiter and verbalizer ---------------------------------------------------------------------------
def conflicted():
    """A qualifier-implies-stem definition the 'mined' values violate."""
    from verdict_core.engine import Engine
    from verdict_core.patient import Resolution, ResolvedPatient

    p = program(2)
    p["atoms"].append({"name": "has_condition_2@@severe", "domain": "bool", "kind": "diagnosis",
                       "definition": "Severe condition 2."})
    p["definitions"] = [{"id": "d1", "kind": "qualifier_implies_stem",
                         "formula": {"op": "implies", "if": "has_condition_2@@severe", "then": "has_condition_2"}}]
    p["cohorts"][0]["exclusion"].append({"id": "exc2", "text": "Severe condition 2", "formula": "has_condition_2@@severe"})
    prog = check_program(TrialProgram(trial_id=trial_id(2), **p))
    note = PatientDoc(patient_id="synth-2", text=patient(2).text + " Severe condition 2 was diagnosed last year.")
    pat = ResolvedPatient(patient_id="synth-2", trial_id=prog.trial_id, program_hash=prog.content_hash, resolutions=[
        Resolution(atom="has_condition_2", status="observed", value=False, evidence="No prior illnesses"),
        Resolution(atom="has_condition_2@@severe", status="observed", value=True, evidence="Severe condition 2"),
    ])
    d = Engine().decide(prog, pat)
    assert d.conflicts
    return prog, note, pat, d.conflicts


def test_arbiter_override_is_checked(scripted_server):
    prog, note, pat, conflicts = conflicted()
    good = {"overrides": [{"atom": "has_condition_2", "value": True, "evidence": "Severe condition 2 was diagnosed",
                           "reason": "the severe form implies the condition"}]}
    set_answers(scripted_server, R(content=good))
    res = run(lambda fz: fz.arbitrate(prog, note, pat, conflicts), teacher(scripted_server.url))
    assert res.status == "accepted" and res.output[0].atom == "has_condition_2" and res.output[0].value is True
    # an override that leaves the contradiction in place is rejected
    useless = {"overrides": [{"atom": "has_condition_2", "value": False, "evidence": "No prior illnesses",
                              "reason": "chart says no illnesses"}]}
    set_answers(scripted_server, R(content=useless))
    res = run(lambda fz: fz.arbitrate(prog, note, pat, conflicts), teacher(scripted_server.url))
    assert res.status == "rejected" and res.reason == "consistency"


def test_verbalizer_may_only_restate(scripted_server):
    from verdict_core.engine import Engine

    prog, note, pat, _ = conflicted()
    d = Engine().decide(prog, pat)
    ok = {"decision": d.decision, "rationale": "The decision stands as recorded by the solver."}
    set_answers(scripted_server, R(content=ok))
    res = run(lambda fz: fz.verbalize(prog, pat, d), teacher(scripted_server.url))
    assert res.status == "accepted" and res.output == ok["rationale"]
    flipped = "eligible" if d.decision != "eligible" else "ineligible"
    set_answers(scripted_server, R(content={"decision": flipped, "rationale": "Looks fine."}))
    res = run(lambda fz: fz.verbalize(prog, pat, d), teacher(scripted_server.url))
    assert res.status == "rejected" and res.reason == "decision"
    set_answers(scripted_server, R(content={"decision": d.decision, "rationale": "Creatinine was 4.7 mg/dL."}))
    res = run(lambda fz: fz.verbalize(prog, pat, d), teacher(scripted_server.url))
    assert res.status == "rejected" and res.reason == "unsupported_number"


def test_schema_sent_for_decoding_keeps_the_identifier_language():
    import re

    from data_gen.formalizer import core_schema
    from verdict_core.errors import ProgramError
    from verdict_core.program import load_program

    text = json.dumps(core_schema("parsed-trial"))
    assert "{0," not in text  # xgrammar cannot compile bounded repetition in the recursive schema
    assert "maxLength" not in text  # vLLM refuses a pattern combined with a length bound
    pattern = core_schema("parsed-trial")["$defs"]["Atom"]["properties"]["name"]["pattern"]
    for name, ok in [("has_stroke@@within_6_months", True), ("x", True), ("9lives", False), ("a b", False)]:
        assert bool(re.fullmatch(pattern, name)) is ok
    # the length limit the schema leaves out is enforced by the core's models on the reply
    too_long = "a" * 300
    try:
        load_program({"trial_id": "T", "atoms": [{"name": too_long, "domain": "bool", "kind": "other", "definition": "x"}],
                      "cohorts": [{"id": "c", "inclusion": [{"id": "i", "text": "", "formula": too_long}]}]})
        raise AssertionError("an over-long name must be refused")
    except ProgramError as e:
        assert "longer than 256" in str(e)

