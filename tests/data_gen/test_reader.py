"""The chart read once (issue 23): sound reductions (selection, de-duplication), the reader stage's
check, and the fact sheet shared by every trial of a patient, over real HTTP to the scripted server
playing a reader that misses nothing it is shown."""

from __future__ import annotations

import asyncio

import pytest
from verdict.core.configs import ConfigError
from verdict.core.program import TrialProgram, check_program
from verdict.data_gen.formalizer import Formalizer
from verdict.data_gen.formalizer.chart import DocumentSelection, locate, reduce_chart
from verdict.data_gen.formalizer.passages import Passage
from verdict.data_gen.formalizer.protocol import NoteDocument, PatientDoc
from verdict.data_gen.formalizer.reader import (
    ChartReading,
    ReaderCall,
    check_reader_output,
)
from verdict.data_gen.scripted_server import Match, Rule, Script
from verdict.data_gen.scripted_server import ScriptedResponse as R

from .teacher_data import (
    AGE,
    COND_1,
    COPIED,
    READER_MARK,
    chart_script,
    long_chart,
    program,
    teacher_config,
    trial_id,
)


def doc(i: int, text: str, date: str | None = None, kind: str | None = None) -> NoteDocument:
    return NoteDocument(id=f"d{i}", text=text, date=date, kind=kind)


# ---- reductions ----------------------------------------------------------------------------------
def test_copied_forward_text_is_kept_in_the_latest_document_and_each_removal_is_recorded():
    docs = [
        doc(1, f"Admission.\n\n{COPIED}", "2024-01-05"),
        doc(2, f"{COPIED}\n\nToday stable.", "2024-03-01"),
        doc(3, COPIED, "2024-02-01"),  # only copied text: dropped, naming the keeper
        doc(4, "Plan:\n\nfollow up", "2023-12-01"),
        doc(5, "Plan:\n\nrepeat labs", "2024-04-01"),  # a short heading is never removed
    ]
    r = reduce_chart([*docs, doc(6, " \n\t ")])  # a blank document: dropped, named
    kept = {d.id: d.text for d in r.documents}
    assert kept["d2"] == f"{COPIED}\n\nToday stable." and kept["d1"] == "Admission."
    assert "Plan:" in kept["d4"] and "Plan:" in kept["d5"]
    assert [(d.id, d.why) for d in r.dropped] == [("d6", "empty"), ("d3", "duplicate")]
    assert "d2" in r.dropped[1].detail
    assert [(t.id, t.paragraphs_removed, t.kept_in) for t in r.trimmed] == [("d1", 1, ["d2"])]
    assert [d.id for d in r.documents] == ["d1", "d2", "d4", "d5"]  # chart order kept


def test_undated_copies_yield_to_dated_ones_and_ties_to_the_later_document():
    r = reduce_chart([doc(1, COPIED, "2024-01-01"), doc(2, COPIED), doc(3, COPIED, "2024-01-01")])
    assert [d.id for d in r.documents] == ["d3"]
    assert sorted(d.id for d in r.dropped) == ["d1", "d2"]


def test_selection_drops_by_kind_and_date_window_and_keeps_what_it_cannot_tell():
    sel = DocumentSelection(kinds=["progress_note"], since="2024-01-01", until="2024-12-31")
    docs = [
        doc(1, "a1", "2024-05-01", "progress_note"),
        doc(2, "a2", "2024-05-01", "billing"),
        doc(3, "a3", "2023-05-01", "progress_note"),
        doc(4, "a4", "2025-02-01T10:00:00Z", "progress_note"),
        doc(5, "a5"),  # no kind, no date: kept
    ]
    r = reduce_chart(docs, sel)
    assert [d.id for d in r.documents] == ["d1", "d5"]
    why = {d.id: d.detail for d in r.dropped}
    assert "billing" in why["d2"] and "before" in why["d3"] and "after" in why["d4"]
    assert all(d.why == "selection" for d in r.dropped)
    assert not DocumentSelection().active


def test_reading_config_is_strict():
    with pytest.raises((ConfigError, ValueError), match="selction"):
        ChartReading.model_validate({"selction": {}})
    with pytest.raises(ValueError, match="after until"):
        DocumentSelection(since="2024-02-01", until="2024-01-01")


def test_locate_finds_the_original_offset_across_whitespace():
    assert locate("treated  with\nlisinopril", COPIED) == COPIED.index("treated")
    assert locate("treated with enalapril", COPIED) is None


# ---- the reader's check --------------------------------------------------------------------------
def test_an_excerpt_not_verbatim_in_one_passage_is_rejected_by_id_never_by_text():
    a, b = doc(1, "She has diabetes. Her mother has asthma.", "2024-01-01"), doc(2, "Creatinine 1.1 mg/dL.")
    call = ReaderCall(
        [Passage("d1", 1, 1, 0, len(a.text), a.text), Passage("d2", 1, 1, 0, len(b.text), b.text)], []
    )

    def check(answer: str):
        return check_reader_output(answer, "stop", call, {"d1": a, "d2": b}, max_tokens=512)

    ok = check('{"excerpts": ["She has diabetes.", "Creatinine 1.1 mg/dL."]}')
    assert ok.ok and [(e.document, e.offset, e.date) for e in ok.output] == [
        ("d1", 0, "2024-01-01"),
        ("d2", 0, None),
    ]
    bad = check('{"excerpts": ["She has type 2 diabetes.", "asthma. Creatinine"]}')
    assert not bad.ok and len(bad.messages) == 2  # a paraphrase, and a span across two documents
    assert all("diabetes" not in m and "asthma" not in m for m in bad.messages)


# ---- read once, over HTTP ------------------------------------------------------------------------
def script() -> Script:
    return Script.model_validate(chart_script())


def reader_requests(srv) -> int:
    return sum(READER_MARK in r.body["messages"][0]["content"] for r in srv.requests)


def match_two_trials(url, record, reading=ChartReading(), cache=None):
    """Both sides of trial 1, then both sides of trial 2, with one formalizer (one process)."""

    async def go():
        fz = Formalizer(teacher_config(url, max_retries=0, context_tokens=4096), reading=reading, cache=cache)
        out = []
        try:
            for i in (1, 2):
                prog = check_program(TrialProgram(trial_id=trial_id(i), **program(i)))
                out.append(
                    await asyncio.gather(
                        *(fz.mine_values(prog, record, s) for s in ("inclusion", "exclusion"))
                    )
                )
        finally:
            await fz.aclose()
        return out

    return asyncio.run(go())


def test_a_long_chart_is_read_once_for_two_trials_and_mined_against_its_sheet(scripted_server):
    scripted_server.set_script(script())
    (inc1, exc1), (inc2, exc2) = match_two_trials(scripted_server.url, long_chart())
    first = reader_requests(scripted_server)
    read = inc1.chart_read
    assert first >= 2 and read is not None and read.calls == first  # several passage groups, read once
    assert [r.chart_read.reused for r in (inc1, exc1)].count(False) == 1  # one side read, the other waited
    assert inc2.chart_read.reused and exc2.chart_read.reused
    assert reader_requests(scripted_server) == first  # the second trial made no reader call
    assert read.documents == 12 and read.excerpts_kept == 2 and read.sheet_documents == ["d3", "d7"]
    assert [(t.id, t.kept_in) for t in read.trimmed] == [("d2", ["d11"])]
    # the miner read the sheet, not the chart: no filler in any miner request
    miner = [r for r in scripted_server.requests if READER_MARK not in r.body["messages"][0]["content"]]
    assert miner and not any("was cleaned" in r.body["messages"][1]["content"] for r in miner)
    got = {mv.atom: mv.value for res in (inc1, exc1) for mv in res.output}
    assert got["age_years"] == 52 and got["has_condition_1"] is True  # quotes on the sheet: found
    assert got["is_pregnant"] is None  # on the chart but not read: unresolved, never false
    assert inc1.output.sources["age_years"] == "d3"


def test_a_large_fact_sheet_is_routed_to_the_atoms_and_a_smaller_one_read_whole(scripted_server):
    """A reader that keeps every paragraph makes a sheet as long as the chart: above
    `route_above_tokens` each atom chunk reads only what bears on its atoms (no filler reaches the
    miner, the facts still do); at or below it, every chunk reads the whole sheet."""
    from tests.data_gen.teacher_data import filler

    keep_all = [filler(i) for i in range(1, 13)] + [AGE, COND_1]
    scripted_server.set_script(
        Script(
            rules=[
                Rule(
                    match=Match(contains=[READER_MARK]),
                    responses=[R(auto="excerpts", auto_excerpts=keep_all)],
                )
            ],
            default=script().default,
        )
    )
    routed = ChartReading(route_above_tokens=0)
    (inc, exc), _ = match_two_trials(scripted_server.url, long_chart(), routed)
    assert inc.chart_read.routed and inc.chart_read.excerpts_kept >= 14
    miner = [r for r in scripted_server.requests if READER_MARK not in r.body["messages"][0]["content"]]
    assert miner and not any("was cleaned" in r.body["messages"][1]["content"] for r in miner)
    got = {mv.atom: mv.value for res in (inc, exc) for mv in res.output}
    assert got["age_years"] == 52 and got["has_condition_1"] is True
    before = len(scripted_server.requests)
    (inc, _), _ = match_two_trials(scripted_server.url, long_chart(), ChartReading(route_above_tokens=10**6))
    assert not inc.chart_read.routed
    whole = [
        r for r in scripted_server.requests[before:] if READER_MARK not in r.body["messages"][0]["content"]
    ]
    assert any("was cleaned" in r.body["messages"][1]["content"] for r in whole)  # the whole sheet


def test_a_small_chart_is_mined_directly_without_a_reader_call(scripted_server):
    scripted_server.set_script(script())
    small = PatientDoc(patient_id="p", documents=[doc(1, f"{AGE}, {COND_1}."), doc(2, "No other history.")])
    (inc, exc), _ = match_two_trials(scripted_server.url, small)
    assert reader_requests(scripted_server) == 0 and inc.chart_read is None
    assert {mv.atom: mv.value for mv in inc.output}["age_years"] == 52


def test_reading_off_mines_the_whole_chart(scripted_server):
    scripted_server.set_script(script())
    (inc, _), _ = match_two_trials(scripted_server.url, long_chart(), ChartReading(enabled=False))
    assert reader_requests(scripted_server) == 0 and inc.chart_read is None
    assert {mv.atom: mv.value for mv in inc.output}["age_years"] == 52


def test_a_reading_that_fails_validation_keeps_the_group_whole(scripted_server):
    bad = R(content={"excerpts": ["a sentence the chart never says"]})
    scripted_server.set_script(
        Script(
            rules=[Rule(match=Match(contains=[READER_MARK]), responses=[bad])],
            default=script().default,
        )
    )
    (inc, exc), _ = match_two_trials(scripted_server.url, long_chart())
    read = inc.chart_read
    assert read.kept_whole and read.excerpts_kept > 0
    got = {mv.atom: mv.value for res in (inc, exc) for mv in res.output}
    assert got["age_years"] == 52 and got["is_pregnant"] is True  # nothing lost: the text was kept


def test_a_small_chart_with_copies_is_mined_whole_and_says_what_it_left_out(scripted_server):
    scripted_server.set_script(script())
    small = PatientDoc(
        patient_id="p",
        documents=[doc(1, f"{AGE}.\n\n{COPIED}", "2024-01-01"), doc(2, COPIED, "2024-02-01"), doc(3, "x")],
    )
    sel = ChartReading(selection=DocumentSelection(since="2024-01-01"))
    (inc, _), _ = match_two_trials(scripted_server.url, small, sel)
    read = inc.chart_read
    assert reader_requests(scripted_server) == 0 and read.mined_whole
    assert [(t.id, t.kept_in) for t in read.trimmed] == [("d1", ["d2"])] and read.dropped == []
    assert read.summary().startswith("mined whole: 3 documents") and "d1 -> d2" in read.summary()
    assert {mv.atom: mv.value for mv in inc.output}["age_years"] == 52


def test_a_selection_that_drops_every_document_asks_nothing_and_records_why(scripted_server):
    scripted_server.set_script(script())
    chart = PatientDoc(patient_id="p", documents=[doc(1, f"{AGE}.", "2020-01-01"), doc(2, "y", "2021-01-01")])
    sel = ChartReading(selection=DocumentSelection(since="2024-01-01"))
    (inc, exc), _ = match_two_trials(scripted_server.url, chart, sel)
    assert not scripted_server.requests and inc.accepted and exc.accepted
    assert all(mv.value is None for mv in inc.output)
    assert [d.id for d in inc.chart_read.dropped] == ["d1", "d2"]
    assert "not read: d1 (selection: dated 2020-01-01 before the window" in inc.chart_read.summary()


def test_a_rerun_in_a_new_process_reads_the_chart_from_the_call_cache(scripted_server, tmp_path):
    from verdict.data_gen.formalizer.cache import CallCache

    scripted_server.set_script(script())
    cache = CallCache(tmp_path / "calls.sqlite")
    (inc, _), _ = match_two_trials(scripted_server.url, long_chart(), cache=cache)
    paid = inc.chart_read.calls
    sent = len(scripted_server.requests)
    (again, _), _ = match_two_trials(scripted_server.url, long_chart(), cache=cache)  # a new formalizer
    assert len(scripted_server.requests) == sent  # no call at all: the reading and the mining were cached
    assert again.chart_read.calls == 0 and again.chart_read.cache_hits == paid and not again.chart_read.reused
    assert {mv.atom: mv.value for mv in again.output}["age_years"] == 52


def test_a_statement_repeated_across_documents_stays_on_the_sheet_once_in_the_latest_document():
    from verdict.data_gen.formalizer.reader import Excerpt, latest_copies

    originals = {d.id: d for d in (doc(1, "x", "2024-03-01"), doc(2, "y", "2024-01-01"), doc(3, "z"))}
    said = [
        Excerpt(document="d1", offset=0, text="Allergic to penicillin."),
        Excerpt(document="d1", offset=40, text="Smokes daily."),
        Excerpt(document="d2", offset=5, text="Allergic  to\npenicillin."),
        Excerpt(document="d3", offset=0, text="Smokes daily."),
    ]
    kept = latest_copies(said, originals)
    # d1 is the latest dated; undated d3 counts as oldest
    assert [(e.document, e.text) for e in kept] == [
        ("d1", "Allergic to penicillin."),
        ("d1", "Smokes daily."),
    ]
