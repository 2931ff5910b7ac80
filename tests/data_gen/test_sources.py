"""Loaders for the benchmarks layout and ClinicalTrials.gov study JSON; bad rows are reported."""

import json

import pytest
from verdict.data_gen.formalizer.errors import SourceError
from verdict.data_gen.sources import load_pairs, load_patients, load_trials, split_criteria

from tests.support import BENCHMARKS, need


def test_shared_benchmarks_load_cleanly():
    need((BENCHMARKS / "trials.jsonl").exists(), "shared benchmark data (../shared/data/benchmarks)")
    trials = load_trials(BENCHMARKS / "trials.jsonl")
    assert len(trials.items) == 864 and trials.problems == []
    assert all(t.criteria_text() for t in trials.items)
    patients = load_patients(BENCHMARKS / "patients_sigir.jsonl", data_class="public")
    assert len(patients.items) == 59 and patients.items[0].data_class == "public"
    pairs = load_pairs(BENCHMARKS / "pairs_sigir.jsonl", scores=[1, 2])
    assert pairs.items and all(p.score in (1, 2) for p in pairs.items)
    some = load_trials(BENCHMARKS / "trials.jsonl", ids=["NCT00005485", "NCT00000000"])
    assert [t.trial_id for t in some.items] == ["NCT00005485"] and "NCT00000000" in some.problems[0]
    text = some.items[0].criteria_text()
    assert (
        text.startswith("Inclusion criteria:\nAfrican American")
        and "Exclusion criteria:\nInstitutionalization" in text
    )


def test_malformed_rows_are_reported_not_fatal(tmp_path):
    p = tmp_path / "trials.jsonl"
    p.write_text(
        "\n".join(
            [
                json.dumps({"nct_id": "NCT1", "title": "ok", "inclusion": "adults", "exclusion": None}),
                "{broken",
                json.dumps({"title": "no id", "criteria": "x"}),
                json.dumps({"nct_id": "NCT2", "criteria": "  "}),
                json.dumps({"nct_id": "NCT3", "criteria": ["not", "text"]}),
                json.dumps(["a list"]),
                json.dumps({"nct_id": "NCT1", "criteria": "duplicate"}),
                json.dumps(
                    {
                        "nct_id": "NCT4",
                        "criteria": "Inclusion Criteria:\n- adults\nExclusion Criteria:\n- none",
                    }
                ),
            ]
        )
        + "\n"
    )
    out = load_trials(p)
    assert [t.trial_id for t in out.items] == ["NCT1", "NCT4"]
    joined = "\n".join(out.problems)
    for where in (
        "trials.jsonl:2: not valid JSON",
        "trials.jsonl:3: no 'nct_id'",
        "'NCT2' has no criteria",
        "'NCT3': criteria must be text",
        "trials.jsonl:6: expected a JSON object",
        "duplicate trial id 'NCT1'",
    ):
        assert where in joined


def test_patient_problems_never_quote_the_note(tmp_path):
    p = tmp_path / "patients.jsonl"
    p.write_text(
        json.dumps({"_id": "p1", "text": "A 71-year-old retired welder"})
        + "\n"
        + json.dumps({"_id": "p2", "text": 12})
        + "\n"
        + json.dumps({"text": "A 44-year-old nurse"})
        + "\n"
    )
    out = load_patients(p)
    assert [x.patient_id for x in out.items] == ["p1"]
    assert out.problems == ["patients.jsonl:2: patient 'p2' has no 'text'", "patients.jsonl:3: no '_id'"]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        load_patients(tmp_path / "nope.jsonl")


def study(nct, text, title="A study", capitalized=False):
    s = {
        "protocolSection": {
            "identificationModule": {"nctId": nct, "briefTitle": title},
            "eligibilityModule": {"eligibilityCriteria": text},
        }
    }
    if capitalized:  # the classic API shape
        s = {
            "FullStudy": {
                "Study": {
                    "ProtocolSection": {
                        "IdentificationModule": {"NCTId": nct, "BriefTitle": title},
                        "EligibilityModule": {"EligibilityCriteria": text},
                    }
                }
            }
        }
    return s


CRIT = "Inclusion Criteria:\n\n* Age >= 18\n\nExclusion Criteria:\n\n* Pregnancy"


def test_ctgov_study_json_shapes(tmp_path):
    d = tmp_path / "studies"
    d.mkdir()
    (d / "one.json").write_text(json.dumps(study("NCT01", CRIT)))
    (d / "list.json").write_text(json.dumps([study("NCT02", CRIT), {"protocolSection": {}}]))
    (d / "page.json").write_text(json.dumps({"studies": [study("NCT03", "Adults only")]}))
    (d / "bad.json").write_text("{nope")
    out = load_trials(d)
    assert sorted(t.trial_id for t in out.items) == ["NCT01", "NCT02", "NCT03"]
    by = out.by_id("trial_id")
    assert by["NCT01"].inclusion == "* Age >= 18" and by["NCT01"].exclusion == "* Pregnancy"
    assert by["NCT03"].inclusion is None and by["NCT03"].criteria_text() == "Adults only"
    assert any("bad.json: not valid JSON" in p for p in out.problems)
    assert any("list.json[1]: no protocolSection" in p for p in out.problems)


def test_classic_api_shape(tmp_path):
    f = tmp_path / "classic.json"
    f.write_text(json.dumps(study("NCT09", CRIT, capitalized=True)))
    out = load_trials(f)
    assert out.items[0].trial_id == "NCT09" and out.items[0].title == "A study"


def test_split_criteria():
    assert split_criteria("inclusion criteria: a\nEXCLUSION CRITERIA:\nb") == ("a", "b")
    assert split_criteria("only some text") == (None, None)
