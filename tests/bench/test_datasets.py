"""verdict.bench.datasets: TREC 2021 / SIGIR / site JSONL loaders, malformed rows, sampling."""

import json

import pytest
from verdict.bench.datasets import DatasetConfig, SampleConfig, load_dataset, sample_pairs
from verdict.bench.protocol import BenchError, LabeledPair

from tests.support import BENCHMARKS, SHARED_DATA, need


def write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@pytest.fixture
def texts(tmp_path):
    trials = write(
        tmp_path / "trials.jsonl",
        [
            {"nct_id": f"NCT{i}", "title": "", "inclusion": "Adults", "exclusion": "Pregnancy"}
            for i in range(4)
        ],
    )
    patients = write(tmp_path / "patients.jsonl", [{"_id": f"p{i}", "text": f"note {i}"} for i in range(4)])
    return trials, patients


def test_trec_scores_map_like_the_paper_and_bad_rows_are_reported(tmp_path, texts):
    trials, patients = texts
    pairs = write(
        tmp_path / "pairs.jsonl",
        [
            {"patient_id": "p0", "nct_id": "NCT0", "score": 2},
            {"patient_id": "p1", "nct_id": "NCT0", "score": 1},
            {"patient_id": "p2", "nct_id": "NCT0", "score": 0},
            {"patient_id": "p3", "nct_id": "NCT0", "score": 3},
            {"patient_id": "p3", "nct_id": "NCT1", "score": "2"},
            "{broken",
            {"nct_id": "NCT2", "score": 2},
            {"patient_id": "p0", "nct_id": "NCT0", "score": 1},  # the same pair again
            {"patient_id": "p1", "nct_id": "NCT9", "score": 2},  # no criteria text for NCT9
        ],
    )
    ds = load_dataset(
        DatasetConfig(kind="trec2021", pairs=str(pairs), patients=str(patients), trials=[str(trials)])
    )
    assert [(p.pair_id, p.label) for p in ds.pairs] == [("p0__NCT0", "eligible"), ("p1__NCT0", "ineligible")]
    assert ds.dropped == {"score 0 (not relevant)": 1}
    text = "\n".join(ds.problems)
    assert "pairs.jsonl:4: 'score' must be 0, 1 or 2 (got 3)" in text
    assert "pairs.jsonl:5: 'score' must be 0, 1 or 2" in text
    assert "pairs.jsonl:6: not valid JSON" in text
    assert "pairs.jsonl:7: needs 'patient_id' and 'trial_id' (or 'nct_id')" in text
    assert "pairs.jsonl:8: pair 'p0__NCT0' repeats an earlier row" in text
    assert "pairs.jsonl:9: pair 'p1__NCT9': no criteria text for trial 'NCT9'" in text
    assert len(ds.problems) == 6 and ds.summary()["skipped"] == 6


def test_site_jsonl_labels(tmp_path, texts):
    trials, patients = texts
    pairs = write(
        tmp_path / "site.jsonl",
        [
            {"patient_id": "p0", "trial_id": "NCT0", "label": "eligible"},
            {"patient_id": "p1", "nct_id": "NCT1", "label": False},
            {"patient_id": "p2", "trial_id": "NCT2", "label": "yes"},
            {"patient_id": "p9", "trial_id": "NCT2", "label": True},  # no note for p9
        ],
    )
    ds = load_dataset(
        DatasetConfig(kind="jsonl", pairs=str(pairs), patients=str(patients), trials=[str(trials)])
    )
    assert [(p.pair_id, p.label) for p in ds.pairs] == [("p0__NCT0", "eligible"), ("p1__NCT1", "ineligible")]
    assert any("site.jsonl:3: 'label'" in p for p in ds.problems)
    assert any("no note for patient 'p9'" in p for p in ds.problems)
    assert set(ds.trials) == {"NCT0", "NCT1"} and set(ds.patients) == {"p0", "p1"}


def test_sigir_gold_file(tmp_path):
    gold = tmp_path / "gold.json"
    gold.write_text(
        json.dumps({"gold": {"s1__NCT1": True, "s1__NCT2": False, "broken": True, "s2__NCT3": "yes"}})
    )
    ds = load_dataset(DatasetConfig(kind="sigir", pairs=str(gold), require_text=False))
    assert [(p.pair_id, p.label) for p in ds.pairs] == [("s1__NCT1", "eligible"), ("s1__NCT2", "ineligible")]
    assert ds.problems == [
        "gold.json#broken: key is not '<patient>__<trial>'",
        "gold.json#s2__NCT3: label must be true or false",
    ]


def test_no_usable_pair_is_a_clear_error(tmp_path, texts):
    trials, patients = texts
    pairs = write(tmp_path / "pairs.jsonl", ["{broken"])
    with pytest.raises(BenchError, match="no usable pairs.*not valid JSON"):
        load_dataset(
            DatasetConfig(kind="trec2021", pairs=str(pairs), patients=str(patients), trials=[str(trials)])
        )
    with pytest.raises(BenchError, match="dataset file not found"):
        load_dataset(DatasetConfig(kind="trec2021", pairs=str(tmp_path / "nope.jsonl"), require_text=False))


def test_require_text_needs_sources():
    with pytest.raises(ValueError, match="require_text needs"):
        DatasetConfig(kind="trec2021", pairs="x.jsonl")


def pairs_of(n_e, n_i):
    return [
        LabeledPair(pair_id=f"e{i}", patient_id=f"e{i}", trial_id="t", label="eligible") for i in range(n_e)
    ] + [
        LabeledPair(pair_id=f"i{i}", patient_id=f"i{i}", trial_id="t", label="ineligible") for i in range(n_i)
    ]


def test_class_balanced_sampling_is_seeded():
    pairs = pairs_of(30, 80)
    a = sample_pairs(pairs, SampleConfig(per_class=10, seed=1))
    b = sample_pairs(pairs, SampleConfig(per_class=10, seed=1))
    c = sample_pairs(pairs, SampleConfig(per_class=10, seed=2))
    assert [p.pair_id for p in a] == [p.pair_id for p in b] != [p.pair_id for p in c]
    assert sum(p.label == "eligible" for p in a) == 10 and sum(p.label == "ineligible" for p in a) == 10
    assert [p.pair_id for p in a] == [p.pair_id for p in pairs if p in a]  # file order kept
    small = sample_pairs(pairs_of(3, 50), SampleConfig(per_class=10))
    assert sum(p.label == "eligible" for p in small) == 3  # a class smaller than per_class is taken whole
    assert len(sample_pairs(pairs, SampleConfig(n=25, seed=0))) == 25
    with pytest.raises(ValueError, match="exactly one of per_class"):
        SampleConfig(per_class=3, n=4)


def test_shared_trec2021_counts_match_the_data_readme():
    need((BENCHMARKS / "pairs_trec2021.jsonl").exists(), "shared benchmark data missing")
    ds = load_dataset(
        DatasetConfig(
            kind="trec2021",
            pairs=str(BENCHMARKS / "pairs_trec2021.jsonl"),
            patients=str(BENCHMARKS / "patients_trec2021.jsonl"),
            trials=[str(BENCHMARKS / "trials.jsonl")],
        )
    )
    # ../shared/data/README.md: TREC 2021 here has 287 eligible and 333 ineligible pairs
    assert ds.counts() == {"eligible": 287, "ineligible": 333}
    assert ds.dropped == {"score 0 (not relevant)": 1024} and ds.problems == []


def test_shared_sigir_gold_has_552_pairs():
    gold = SHARED_DATA / "reference" / "gold_5sys_freeform_balanced.json"
    need(gold.exists(), "shared reference data missing")
    ds = load_dataset(DatasetConfig(kind="sigir", pairs=str(gold), require_text=False))
    assert len(ds.pairs) == 552 and ds.counts() == {"eligible": 278, "ineligible": 274}
