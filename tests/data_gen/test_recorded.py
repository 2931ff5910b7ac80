"""The recorded teacher: the paper authors' outputs as checked per-criterion parser records and
value-miner records (no API calls)."""

import json
import subprocess
import sys

import pytest
from verdict.core.program import ParsedCriterion
from verdict.data_gen.export import export_datasets
from verdict.data_gen.formalizer import check_miner_output, quote_in_note
from verdict.data_gen.recorded import import_recorded, recorded_evidence, requirement_outputs
from verdict.data_gen.records import RecordStore

from tests.support import BENCHMARKS, REFERENCE_V6, need


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    need(REFERENCE_V6.is_dir() and (BENCHMARKS / "patients_sigir.jsonl").exists(), "shared reference data")
    out = tmp_path_factory.mktemp("recorded")
    summary = import_recorded(
        REFERENCE_V6, BENCHMARKS / "patients_sigir.jsonl", out / "runs", trials_path=TRIAL_FILES
    )
    return out, summary


TRIAL_FILES = [BENCHMARKS / "trials.jsonl", BENCHMARKS / "trials_judged0_only.jsonl"]


def test_import_checks_every_record(recorded):
    out, s = recorded
    assert s.files == 76 and s.problems == []
    assert s.accepted >= 60 and s.accepted + s.rejected > s.files  # two sides per file, some sides empty
    assert set(s.reasons) <= {"evidence"}  # the programs are valid; some recorded quotes are commentary
    store = RecordStore(out / "runs" / "recorded-v6" / "records.sqlite")
    recs = store.records()
    store.close()
    notes = {
        json.loads(line)["_id"]: json.loads(line)["text"]
        for line in (BENCHMARKS / "patients_sigir.jsonl").read_text().splitlines()
    }
    recs = [r for r in recs if r.task == "value_miner"]
    for r in recs:
        assert r.teacher == "recorded-v6" and r.trial_id.startswith("NCT")
        assert notes[r.patient_id].split(".")[0] in r.messages[1]["content"]
        if r.status == "accepted":
            for v in json.loads(r.output_json)["values"]:
                assert v.get("evidence", "") == "" or quote_in_note(v["evidence"], notes[r.patient_id])
    # variants a, b, ... of one trial are separate records under the same trial id
    variants = [r for r in recs if r.trial_id == "NCT01356992" and r.patient_id == "sigir-20141"]
    assert len({r.record_id for r in variants}) >= 6


def test_import_makes_per_criterion_parser_records(recorded):
    out, s = recorded
    store = RecordStore(out / "runs" / "recorded-v6" / "records.sqlite")
    recs = store.records(task="parser")
    programs = store.programs()
    store.close()
    # every file with trial text gives one record per aligned criterion; the rest are counted
    assert s.parser_accepted >= 300 and s.parser_rejected <= 2
    assert s.no_trial_text + len({r.record_id.split("#")[0] for r in recs}) == s.files
    assert s.requirements >= 400 and 0 < s.requirements_unaligned < s.requirements / 5
    assert set(s.alignment) == {"index", "overlap"}
    r = next(r for r in recs if r.status == "accepted")
    assert r.prompt_version == "criterion_parser@v1" and r.messages[1]["content"].startswith(
        ("Inclusion criterion:\n", "Exclusion criterion:\n")
    )
    crit = ParsedCriterion.model_validate_json(r.output_json)
    assert crit.in_scope and crit.atoms
    assert r.trial_id in programs  # the recorded program itself, for mining
    assert r.trial_id not in r.messages[1]["content"]  # the request carries the criterion only


def test_every_imported_record_names_atoms_the_parser_grammar_can_write(recorded):
    """The recorded corpus has names up to 188 characters; the parser's grammar bounds them at
    GRAMMAR_MAX_NAME, so the import renames the longer ones in program and values alike."""
    import re

    from verdict.data_gen.formalizer import core_schema

    out, _ = recorded
    pattern = core_schema("parsed-criterion")["$defs"]["Atom"]["properties"]["name"]["pattern"]
    store = RecordStore(out / "runs" / "recorded-v6" / "records.sqlite")
    recs = [r for r in store.records(task="parser") if r.status == "accepted"]
    miner = [r for r in store.records(task="value_miner") if r.status == "accepted"]
    store.close()
    names = {a.name for r in recs for a in ParsedCriterion.model_validate_json(r.output_json).atoms}
    assert names and all(re.fullmatch(pattern, n) for n in names)
    assert any(len(n) > 100 for n in names)  # long names are kept where they fit
    assert all(re.fullmatch(pattern, v["atom"]) for r in miner for v in json.loads(r.output_json)["values"])


def test_renaming_long_names_keeps_every_decision():
    from verdict.core.engine import Engine
    from verdict.core.reference import load_reference
    from verdict.core.schemas import GRAMMAR_MAX_NAME
    from verdict.data_gen.recorded import fit_to_grammar

    need(REFERENCE_V6.is_dir(), "shared reference data")
    engine, renamed = Engine(), 0
    for f in sorted(REFERENCE_V6.glob("*/*__full.json")):
        case = load_reference(f)
        fit = fit_to_grammar(case)
        if fit is case:
            assert max(len(a.name) for a in case.program.atoms) <= GRAMMAR_MAX_NAME
            continue
        renamed += 1
        names = [a.name for a in fit.program.atoms]
        assert max(map(len, names)) <= GRAMMAR_MAX_NAME and len(set(names)) == len(names)
        assert {r.atom for r in fit.patient.resolutions} == set(names)
        assert (
            engine.decide(fit.program, fit.patient).decision
            == engine.decide(case.program, case.patient).decision
        )
    assert renamed == 40


def test_requirement_outputs_re_express_every_recorded_requirement():
    need(REFERENCE_V6.is_dir(), "shared reference data")
    from verdict.core.reference import load_reference

    p = load_reference(REFERENCE_V6 / "sigir-20147" / "NCT00602537a__full.json").program
    reqs = requirement_outputs(p)
    assert [r.req for r in reqs if r.side == "inclusion"] == ["REQ0", "REQ1", "REQ2", "REQ3"]
    req2 = next(r for r in reqs if r.side == "inclusion" and r.req == "REQ2")
    assert len(req2.criteria) == 2 and req2.output.formula.op == "and"  # components joined
    covered = {cid for r in reqs for cid in r.criteria}
    assert covered == {cr.id for _, _, cr in p.criteria()}
    declared = {a.name for r in reqs for a in r.output.atoms}
    assert declared == {a.name for a in p.atoms}


def test_recorded_set_exports_without_leakage(recorded, tmp_path):
    out, s = recorded
    cards = export_datasets([out / "runs" / "recorded-v6"], tmp_path / "ds", tasks=("value_miner",))
    c = cards["value_miner"]
    assert sum(c["counts"].values()) == s.accepted - c["records"]["duplicates_dropped"]
    assert c["teachers"] == {"recorded-v6": sum(c["counts"].values())}


def test_quoted_parts_become_the_evidence():
    note = "The pain started while she was walking, radiates to the back."
    assert (
        recorded_evidence('"The pain started while she was walking"; no pain at rest', note)
        == "The pain started while she was walking"
    )
    assert recorded_evidence("Chart is silent on pain at rest", note) == "Chart is silent on pain at rest"


def test_check_is_the_formalizers_check():
    # the same function validates live teacher outputs and recorded ones
    from verdict.core.program import TrialProgram, check_program

    from .teacher_data import program, trial_id

    prog = check_program(TrialProgram(trial_id=trial_id(0), **program(0)))
    ok = check_miner_output(
        '{"values":[{"atom":"is_pregnant","value":null}]}', "stop", prog, ["is_pregnant"], "x", max_tokens=0
    )
    assert ok.ok


def _import_recorded(*args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "verdict", "teacher", "import-recorded", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_import_recorded_command(recorded, tmp_path):
    r = _import_recorded(
        "--reference",
        str(REFERENCE_V6),
        "--patients",
        str(BENCHMARKS / "patients_sigir.jsonl"),
        "--out-dir",
        str(tmp_path),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    _, s = recorded
    assert f"{s.accepted} accepted, {s.rejected} rejected" in r.stdout
    r = _import_recorded("--reference", str(tmp_path / "nothing"), "--out-dir", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "no reference files" in r.stderr


def test_the_reader_is_distilled_from_the_recorded_quotes(recorded):

    out, s = recorded
    store = RecordStore(out / "runs" / "recorded-v6" / "records.sqlite")
    recs = store.records(task="reader")
    store.close()
    notes = {
        json.loads(line)["_id"]: json.loads(line)["text"]
        for line in (BENCHMARKS / "patients_sigir.jsonl").read_text().splitlines()
    }
    assert len(recs) == len({r.patient_id for r in recs}) == s.reader_accepted + s.reader_rejected
    assert sum(bool(json.loads(r.output_json)["excerpts"]) for r in recs) >= 0.8 * len(recs)
    assert s.reader_accepted >= 20 and s.reader_rejected == 0  # every target is verbatim by construction
    tagged = 0
    for r in recs:
        items = json.loads(r.output_json)["excerpts"]  # reader v2: each with the terms of its atoms
        excerpts = [e["text"] for e in items]
        tagged += sum(bool(e["terms"]) for e in items)
        assert r.prompt_version == "reader@v2"
        note = notes[r.patient_id]
        assert all(e in note for e in excerpts)  # verbatim slices of the note
        assert [note.index(e) for e in excerpts] == sorted(note.index(e) for e in excerpts)  # note order
        assert "You read part of a patient's chart" in r.messages[0]["content"]
    assert tagged >= 0.8 * sum(len(json.loads(r.output_json)["excerpts"]) for r in recs)


def test_recorded_excerpts_are_verbatim_pieces_in_note_order_each_once():
    from verdict.data_gen.formalizer.reader import recorded_excerpts

    note = "A 60-year-old  man. He denies smoking. Creatinine 1.1 mg/dL on admission."
    got = recorded_excerpts(
        note, ["Creatinine 1.1 mg/dL", "60-year-old man ... denies smoking", "denies", "absent"]
    )
    assert got == ["60-year-old  man", "denies smoking", "Creatinine 1.1 mg/dL"]


def test_reader_records_export_as_a_dataset_the_value_miner_adapter_trains_on(recorded, tmp_path):
    from verdict.train.sft_data import DatasetError, load_checked

    out, s = recorded
    cards = export_datasets([out / "runs" / "recorded-v6"], tmp_path / "ds", tasks=("reader", "parser"))
    assert (
        sum(cards["reader"]["counts"].values())
        == s.reader_accepted - cards["reader"]["records"]["duplicates_dropped"]
    )
    got = load_checked(tmp_path / "ds" / "reader", "value_miner", ["train"])  # a task of that adapter
    assert len(got["train"]) > 0
    with pytest.raises(DatasetError, match="'parser' dataset"):
        load_checked(tmp_path / "ds" / "parser", "value_miner", ["train"])
