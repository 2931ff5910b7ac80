"""The formalizer stage: structured output, strict checks with verdict_core, one repair, rejection."""

import asyncio
import json

import pytest
from verdict.core.patient import ValueMinerOutput
from verdict.core.program import ParsedCriterion, TrialProgram, check_program
from verdict.data_gen.formalizer import Formalizer, quote_in_note, side_atoms
from verdict.data_gen.formalizer.cache import CallCache
from verdict.data_gen.formalizer.protocol import PatientDoc, TrialDoc
from verdict.data_gen.scripted_server import Match, Rule, Script
from verdict.data_gen.scripted_server import ScriptedResponse as R

from .teacher_data import (
    age_atom,
    criterion_answers,
    criterion_prompt,
    parser_rules,
    patient,
    program,
    trial,
    trial_id,
)
from .teacher_data import teacher_config as teacher


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


def set_parser(srv, *rules):
    srv.set_script(Script(rules=list(rules)))


def answer(prompt: str, *responses) -> Rule:
    return Rule(match=Match(contains=[prompt]), responses=list(responses))


def test_accepts_a_valid_program_one_call_per_criterion(scripted_server):
    set_parser(scripted_server, *parser_rules(0))
    res = parse(scripted_server.url)
    assert res.status == "accepted" and not res.repaired
    assert isinstance(res.output, TrialProgram) and res.output.trial_id == trial_id(0)
    check_program(res.output)
    assert [c.item for c in res.calls] == ["inc-1", "inc-2", "exc-1"] and all(c.accepted for c in res.calls)
    assert [cr.id for _, _, cr in res.output.criteria()] == ["inc-1", "inc-2", "exc-1"]
    assert {a.name: a.source_criteria for a in res.output.atoms}["is_pregnant"] == ["exc-1"]
    # each call's training target: compact JSON that is itself a valid ParsedCriterion
    first = res.calls[0]
    assert " " not in first.output_json.split('"definition"')[0]
    assert ParsedCriterion.model_validate_json(first.output_json).formula.rel == "ge"
    # the request carries the criterion and its side, never the trial id or title (cacheable across trials)
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert first.messages[1]["content"] == criterion_prompt("inclusion", "Adults aged 18 or older")
    assert all(
        trial_id(0) not in json.dumps(r.body) and "Synthetic trial" not in json.dumps(r.body)
        for r in scripted_server.requests
    )
    body = scripted_server.requests[0].body
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["in_scope"]
    assert res.usage.calls_paid == 3 and res.usage.cost_usd > 0
    assert res.usage.cost_usd == pytest.approx(sum(c.usage.cost_usd for c in res.calls))


def test_repair_of_one_criterion_with_the_problems_fed_back(scripted_server):
    set_parser(scripted_server, *parser_rules(0, bad_first=True))
    res = parse(scripted_server.url)
    assert res.status == "accepted"
    inc = next(c for c in res.calls if c.item == "inc-2")
    assert inc.repaired and [a.reason for a in inc.attempts] == ["undeclared_atom", None]
    assert [c.repaired for c in res.calls] == [False, True, False]
    repair = next(r.body["messages"] for r in scripted_server.requests if len(r.body["messages"]) == 4)
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert "- formula: undeclared atom 'has_condition_0_now'" in repair[3]["content"]
    assert inc.messages == repair[:2]  # the record keeps the original prompt, not the repair turn


@pytest.mark.parametrize(
    "bad, reason",
    [
        (R(content={"in_scope": True, "atoms": []}), "schema"),
        (
            R(
                content={
                    "in_scope": True,
                    "atoms": [
                        {"name": "is_pregnant", "domain": "bool", "kind": "other", "definition": "Pregnant."}
                    ],
                    "formula": "is_pregnant_now",
                }
            ),
            "undeclared_atom",
        ),
        (
            R(
                content={
                    "in_scope": True,
                    "atoms": [
                        {
                            "name": "n_pregnancies",
                            "domain": "int",
                            "kind": "other",
                            "definition": "Pregnancies.",
                        }
                    ],
                    "formula": "n_pregnancies",
                }
            ),
            "program",
        ),
        (R(content=criterion_answers(0)[2][1], fault="truncated"), "truncated"),
        (R(content=criterion_answers(0)[2][1], fault="malformed_content"), "json"),
        (R(content=""), "empty"),
    ],
)
def test_a_failing_criterion_is_reported_alone_and_the_rest_assembles(scripted_server, bad, reason):
    exc_prompt = criterion_prompt("exclusion", "Pregnancy")
    set_parser(scripted_server, answer(exc_prompt, bad), *parser_rules(0))
    res = parse(scripted_server.url)
    assert res.status == "accepted"
    exc = next(c for c in res.calls if c.item == "exc-1")
    assert exc.status == "rejected" and exc.reason == reason and exc.output is None
    assert (
        len(
            [
                r
                for r in scripted_server.requests
                if exc_prompt in json.dumps(r.body, ensure_ascii=False).replace("\\n", "\n")
            ]
        )
        == 2
    )  # the output and exactly one repair
    assert res.assembly["unformalized"] == [{"id": "exc-1", "reason": reason}]
    assert res.assembly["formalized"] == ["inc-1", "inc-2"]
    # represented soundly: an open atom the core leaves to screening, never dropped
    (cr,) = res.output.cohorts[0].exclusion
    atom = res.output.atom_table()[cr.formula]
    assert (
        cr.formula == "criterion_exc_1_unformalized"
        and atom.domain == "bool"
        and "Pregnancy" in atom.definition
    )
    from verdict.core.engine import Engine
    from verdict.core.patient import Resolution, ResolvedPatient

    patient = ResolvedPatient(
        patient_id="p",
        trial_id=res.output.trial_id,
        program_hash=res.output.content_hash,
        resolutions=[
            Resolution(atom="age_years", status="observed", value=40),
            Resolution(atom="has_condition_0", status="observed", value=True),
        ],
    )
    decision = Engine(alternatives=0).decide(res.output, patient)
    # open, not false: eligible only on the assumption, listed to confirm at the visit
    assert decision.decision == "eligible"
    assert "criterion_exc_1_unformalized" in {x.atom for x in decision.assumptions}


def test_out_of_scope_criterion_is_left_out_and_reported(scripted_server):
    t = TrialDoc(trial_id="NCT77", inclusion="Adults aged 18 or older\nWilling to sign informed consent")
    set_parser(
        scripted_server,
        answer(
            criterion_prompt("inclusion", "Willing to sign informed consent"),
            R(content={"in_scope": False, "reason": "consent"}),
        ),
        *parser_rules(0),
    )
    res = run(lambda fz: fz.parse_trial(t), teacher(scripted_server.url))
    assert res.status == "accepted" and res.assembly["out_of_scope"] == [{"id": "inc-2", "reason": "consent"}]
    assert [cr.id for _, _, cr in res.output.criteria()] == ["inc-1"]
    assert res.calls[1].output_json == '{"in_scope":false,"reason":"consent"}'


def test_unsatisfiable_assembly_names_the_criteria_in_conflict(scripted_server):
    t = TrialDoc(
        trial_id="NCT78", inclusion="Adults aged 18 or older\nChildren under 10", exclusion="Pregnancy"
    )
    young = {
        "in_scope": True,
        "atoms": [age_atom("Age.")],
        "formula": {"op": "cmp", "lhs": "age_years", "rel": "lt", "rhs": 10},
    }
    set_parser(
        scripted_server,
        answer(criterion_prompt("inclusion", "Children under 10"), R(content=young)),
        *parser_rules(0),
    )
    res = run(lambda fz: fz.parse_trial(t), teacher(scripted_server.url))
    assert all(c.accepted for c in res.calls)  # each criterion alone is fine
    assert res.status == "rejected" and res.reason == "unsatisfiable" and res.output is None
    assert res.assembly["conflict"] == ["inc-1", "inc-2"]
    assert any("criteria in conflict: inc-1, inc-2" in p for p in res.problems)


def test_identical_call_is_never_paid_twice(scripted_server, tmp_path):
    set_parser(scripted_server, *parser_rules(0, bad_first=True))
    cache = CallCache(tmp_path / "c.sqlite")
    first = parse(scripted_server.url, cache=cache)
    n = len(scripted_server.requests)
    second = parse(scripted_server.url, cache=cache)
    assert len(scripted_server.requests) == n == 4  # 3 criteria + 1 repair
    assert all(a.cached for c in second.calls for a in c.attempts) and second.usage.calls_paid == 0
    assert second.output_json == first.output_json and second.status == "accepted"


def test_criterion_cache_answers_a_repeated_criterion_across_trials(scripted_server, tmp_path):
    """The criterion-level cache: the same criterion text in another trial is the same request."""
    set_parser(scripted_server, *parser_rules(0), *parser_rules(1))
    cache = CallCache(tmp_path / "c.sqlite")
    parse(scripted_server.url, 0, cache=cache)
    assert len(scripted_server.requests) == 3
    other = TrialDoc(
        trial_id="NCT00000042",
        title="Another title",
        inclusion="Inclusion Criteria:\n\n-  Adults aged 18 or older\n\n-  Diagnosis of condition 0",
        exclusion="Exclusion Criteria:\n\n-  Pregnancy",
    )
    res = run(lambda fz: fz.parse_trial(other), teacher(scripted_server.url), cache=cache)
    assert len(scripted_server.requests) == 3  # 0 new calls
    assert res.status == "accepted" and res.usage.calls_paid == 0 and res.usage.cache_hits == 3
    assert res.output.trial_id == "NCT00000042"
    # a trial sharing two of three criteria pays for the third only
    parse(scripted_server.url, 1, cache=cache)
    assert len(scripted_server.requests) == 4


def test_type_errors_in_formulas_are_rejected_per_call(scripted_server):
    bad = {
        "in_scope": True,
        "atoms": [
            {
                "name": "age_years",
                "domain": "int",
                "kind": "demographic",
                "unit": "years",
                "definition": "Age.",
            }
        ],
        "formula": "age_years",
    }
    set_parser(
        scripted_server,
        answer(criterion_prompt("inclusion", "Adults aged 18 or older"), R(content=bad)),
        *parser_rules(0),
    )
    res = parse(scripted_server.url)
    inc = res.calls[0]
    assert inc.status == "rejected" and inc.reason == "program"
    assert any("is int but is used as a condition" in p for p in inc.problems)


def test_parser_key_follows_criteria_model_and_prompt_version(monkeypatch):
    from verdict.data_gen.formalizer.prompt_templates import PromptTemplate

    def key(t=None, doc=None):
        return Formalizer(t or teacher("http://127.0.0.1:9/v1")).parser_key(doc or trial(0))

    base = key()
    assert key() == base
    assert key(doc=trial(1)) != base  # other criteria
    assert key(teacher("http://127.0.0.1:9/v1", model="m2")) != base
    reflowed = trial(0).model_copy(
        update={"inclusion": "Adults aged 18 or older\n\nDiagnosis of  condition 0"}
    )
    assert key(doc=reflowed) == base  # the same criteria, laid out otherwise
    real = Formalizer.prompt
    monkeypatch.setattr(
        Formalizer,
        "prompt",
        lambda self, stage: PromptTemplate(
            real(self, stage).name, "v2", "parser", real(self, stage).system, real(self, stage).user, "0" * 64
        ),
    )
    assert key() != base


def test_a_criterion_over_the_prompt_budget_is_split_before_any_call():
    long = " ".join(f"Sentence {i} states one more requirement about the patient's chart." for i in range(90))
    t = teacher("http://127.0.0.1:9/v1", context_tokens=2400, max_tokens={"parser": 400})
    fz = Formalizer(t)
    budget = fz.prompt_budget("parser")
    split = fz.trial_criteria(TrialDoc(trial_id="NCT5", inclusion=long))
    assert len(split.criteria) > 1 and split.oversize == []
    assert all(fz.tokens.count_messages(fz.criterion_messages(c)) <= budget for c in split.criteria)
    assert " ".join(c.text for c in split.criteria) == long


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
    answer = {
        "values": [
            {"atom": "has_condition_1", "value": True, "evidence": "Known  condition 1"},
            {"atom": "age_years", "value": 37, "evidence": "A 37-year-old man"},
        ]
    }
    res = mine(scripted_server.url, prog, "inclusion", R(content=answer), srv=scripted_server)
    assert res.status == "accepted", res.problems
    # canonical target: the prompt's atom order, compact, nulls without evidence
    assert json.loads(res.output_json)["values"][0]["atom"] == "age_years"
    ValueMinerOutput.model_validate_json(res.output_json)
    body = scripted_server.requests[0].body
    user = body["messages"][1]["content"]
    assert NOTE.text.split(".")[0] in user and "has_condition_1" in user and "is_pregnant" not in user
    # the schema sent restricts atom names to the pass's atoms
    enum = body["response_format"]["json_schema"]["schema"]["$defs"]["MinedValue"]["properties"]["atom"][
        "enum"
    ]
    assert enum == ["age_years", "has_condition_1"]
    # one short note: one call, whose prompt and answer are the pass's; each value names the note
    assert [c.item for c in res.calls] == ["note#1/c1"] and res.calls[0].output_json == res.output_json
    assert res.output.sources == {"age_years": "note", "has_condition_1": "note"} and not res.output.conflicts


NULL_COND = {"atom": "has_condition_1", "value": None, "evidence": ""}


@pytest.mark.parametrize(
    "values, reason",
    [
        ([{"atom": "age_years", "value": 37, "evidence": "a 37-year-old woman"}, NULL_COND], "evidence"),
        ([{"atom": "age_years", "value": 37, "evidence": ""}, NULL_COND], "evidence"),
        ([{"atom": "age_years", "value": True, "evidence": "A 37-year-old man"}, NULL_COND], "type"),
        ([{"atom": "age_years", "value": 37.5, "evidence": "A 37-year-old man"}, NULL_COND], "type"),
        ([{"atom": "age_years", "value": None}, NULL_COND, NULL_COND], "coverage"),  # reported twice
        (
            [{"atom": "age_years", "value": None}, NULL_COND, {"atom": "is_pregnant", "value": None}],
            "coverage",
        ),  # not asked
        (
            [
                {"atom": "age_years", "value": None},
                NULL_COND,
                {"atom": "smoker", "value": False, "evidence": "he denies smoking"},
            ],
            "undeclared_atom",
        ),
    ],
)
def test_miner_rejections(scripted_server, prog, values, reason):
    res = mine(scripted_server.url, prog, "inclusion", R(content={"values": values}), srv=scripted_server)
    assert res.status == "rejected" and res.reason == reason, res.problems
    assert not any("37-year-old" in p for p in res.problems)  # problems never quote the note


def test_miner_repair_fixes_evidence(scripted_server, prog):
    bad = {"values": [{"atom": "is_pregnant", "value": False, "evidence": "he is not pregnant"}]}
    good = {"values": [{"atom": "is_pregnant", "value": None, "evidence": ""}]}
    res = mine(
        scripted_server.url, prog, "exclusion", R(content=bad), repair=[R(content=good)], srv=scripted_server
    )
    assert res.status == "accepted" and res.repaired and res.attempts[0].reason == "evidence"
    assert json.loads(res.output_json) == {"values": []}  # sparse: a null is left out


def test_bounds_need_evidence_too(scripted_server, prog):
    ans = {
        "values": [
            {"atom": "age_years", "value": None, "bounds": {"lo": 18}, "evidence": "A 37-year-old man"},
            {"atom": "has_condition_1", "value": None, "evidence": ""},
        ]
    }
    res = mine(scripted_server.url, prog, "inclusion", R(content=ans), srv=scripted_server)
    assert res.status == "accepted", res.problems


@pytest.mark.parametrize(
    "quote, ok",
    [
        ("chest pain radiating to the left arm", True),
        ("chest pain\n  radiating   to the left arm", True),
        ('"he denies smoking"', True),
        ("A 37-year-old man ... he denies smoking", True),
        ("he denies smoking ... A 37-year-old man", False),  # pieces must keep the note's order
        ("chest pains", False),
        ("", False),
    ],
)
def test_quote_in_note(quote, ok):
    assert quote_in_note(quote, NOTE.text) is ok


# ---- arbiter and verbalizer ---------------------------------------------------------------------------
def conflicted():
    """A qualifier-implies-stem definition the 'mined' values violate."""
    from verdict.core.engine import Engine
    from verdict.core.patient import Resolution, ResolvedPatient

    p = program(2)
    p["atoms"].append(
        {
            "name": "has_condition_2@@severe",
            "domain": "bool",
            "kind": "diagnosis",
            "definition": "Severe condition 2.",
        }
    )
    p["definitions"] = [
        {
            "id": "d1",
            "kind": "qualifier_implies_stem",
            "formula": {"op": "implies", "if": "has_condition_2@@severe", "then": "has_condition_2"},
        }
    ]
    p["cohorts"][0]["exclusion"].append(
        {"id": "exc2", "text": "Severe condition 2", "formula": "has_condition_2@@severe"}
    )
    prog = check_program(TrialProgram(trial_id=trial_id(2), **p))
    note = PatientDoc(
        patient_id="synth-2", text=patient(2).text + " Severe condition 2 was diagnosed last year."
    )
    pat = ResolvedPatient(
        patient_id="synth-2",
        trial_id=prog.trial_id,
        program_hash=prog.content_hash,
        resolutions=[
            Resolution(atom="has_condition_2", status="observed", value=False, evidence="No prior illnesses"),
            Resolution(
                atom="has_condition_2@@severe", status="observed", value=True, evidence="Severe condition 2"
            ),
        ],
    )
    d = Engine().decide(prog, pat)
    assert d.conflicts
    return prog, note, pat, d.conflicts


def test_arbiter_override_is_checked(scripted_server):
    prog, note, pat, conflicts = conflicted()
    good = {
        "overrides": [
            {
                "atom": "has_condition_2",
                "value": True,
                "evidence": "Severe condition 2 was diagnosed",
                "reason": "the severe form implies the condition",
            }
        ]
    }
    set_answers(scripted_server, R(content=good))
    res = run(lambda fz: fz.arbitrate(prog, note, pat, conflicts), teacher(scripted_server.url))
    assert (
        res.status == "accepted" and res.output[0].atom == "has_condition_2" and res.output[0].value is True
    )
    # an override that leaves the contradiction in place is rejected
    useless = {
        "overrides": [
            {
                "atom": "has_condition_2",
                "value": False,
                "evidence": "No prior illnesses",
                "reason": "chart says no illnesses",
            }
        ]
    }
    set_answers(scripted_server, R(content=useless))
    res = run(lambda fz: fz.arbitrate(prog, note, pat, conflicts), teacher(scripted_server.url))
    assert res.status == "rejected" and res.reason == "consistency"


def test_checks_run_on_the_engine_passed_in(scripted_server):
    """The parser's satisfiability checks and the arbiter's consistency check use the caller's
    engine (its limit, its compiled programs), not a default or fresh one."""
    from verdict.core.engine import Engine

    prog, note, pat, conflicts = conflicted()
    engine = Engine(timeout_ms=777, alternatives=0)
    good = {
        "overrides": [
            {
                "atom": "has_condition_2",
                "value": True,
                "reason": "the severe form implies it",
                "evidence": "Severe condition 2 was diagnosed",
            }
        ]
    }
    set_answers(scripted_server, R(content=good))
    res = run(
        lambda fz: fz.arbitrate(prog, note, pat, conflicts), teacher(scripted_server.url), engine=engine
    )
    assert res.status == "accepted" and f"{prog.content_hash}@777" in engine._cache
    set_parser(scripted_server, *parser_rules(0))
    parsed = parse(scripted_server.url, engine=engine)
    assert parsed.accepted and f"{parsed.output.content_hash}@777" in engine._cache


def test_verbalizer_may_only_restate(scripted_server):
    from verdict.core.engine import Engine

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
    set_answers(
        scripted_server, R(content={"decision": d.decision, "rationale": "Creatinine was 4.7 mg/dL."})
    )
    res = run(lambda fz: fz.verbalize(prog, pat, d), teacher(scripted_server.url))
    assert res.status == "rejected" and res.reason == "unsupported_number"


def test_schema_sent_for_decoding_keeps_the_identifier_language():
    import re

    from verdict.core.errors import ProgramError
    from verdict.core.formula import MAX_NAME
    from verdict.core.program import load_program
    from verdict.core.schemas import GRAMMAR_MAX_NAME, json_schema
    from verdict.data_gen.formalizer import core_schema

    text = json.dumps(core_schema("parsed-trial"))
    assert "maxLength" not in text  # vLLM refuses a pattern combined with a length bound
    pattern = core_schema("parsed-trial")["$defs"]["Atom"]["properties"]["name"]["pattern"]
    for name, ok in [
        ("has_stroke@@within_6_months", True),
        ("x", True),
        ("9lives", False),
        ("a b", False),
        ("a" * GRAMMAR_MAX_NAME, True),
        ("a" * (GRAMMAR_MAX_NAME + 1), False),
    ]:
        assert bool(re.fullmatch(pattern, name)) is ok  # the grammar bounds a name's length
    # the integrators' program schema states the models' own limit
    program_name = json_schema("program")["$defs"]["Atom"]["properties"]["name"]
    assert program_name["maxLength"] == MAX_NAME and program_name["pattern"].endswith("]*$")
    # and the models enforce it on any reply (a teacher without a grammar)
    too_long = "a" * 300
    try:
        load_program(
            {
                "trial_id": "T",
                "atoms": [{"name": too_long, "domain": "bool", "kind": "other", "definition": "x"}],
                "cohorts": [{"id": "c", "inclusion": [{"id": "i", "text": "", "formula": too_long}]}],
            }
        )
        raise AssertionError("an over-long name must be refused")
    except ProgramError as e:
        assert "longer than 256" in str(e)
