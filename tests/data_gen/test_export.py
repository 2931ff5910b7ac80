"""`verdict teacher export`: chat-format DatasetDicts, splits by trial without leakage, dataset cards."""

import json
import subprocess
import sys

import pytest
from verdict.data_gen.export import assign_splits, export_datasets, split_counts
from verdict.data_gen.formalizer.protocol import StageResult
from verdict.data_gen.records import RecordStore

SYSTEM = {"role": "system", "content": "sys"}


def result(stage, status="accepted", reason=None, n=0, prompt="p"):
    return StageResult(
        stage=stage,
        status=status,
        reason=reason,
        teacher="teacher-a",
        model="m",
        prompt_version=f"{stage}@v1",
        messages=[SYSTEM, {"role": "user", "content": f"{prompt} {n}"}],
        output_json=json.dumps({"n": n}, separators=(",", ":")) if status == "accepted" else None,
    )


def make_run(tmp_path, name="run-a", n_trials=30, n_patients=12, seed=1):
    """Parser records for every trial, miner records for pairs (each patient in several trials)."""
    import random

    rng = random.Random(seed)
    store = RecordStore(tmp_path / name / "records.sqlite")
    for t in range(n_trials):
        tid = f"NCT{t:05d}"
        ok = t % 7 != 3
        store.put(
            result("parser", "accepted" if ok else "rejected", None if ok else "unsatisfiable", t, tid), tid
        )
        for p in rng.sample(range(n_patients), 3):
            for side in ("inclusion", "exclusion"):
                bad = (t + p) % 5 == 0
                store.put(
                    result(
                        f"miner_{side}",
                        "rejected" if bad else "accepted",
                        "evidence" if bad else None,
                        t * 100 + p,
                        f"{tid} note{p} {side}",
                    ),
                    tid,
                    f"pat-{p}",
                )
    store.close()
    return tmp_path / name


def test_splits_never_share_a_trial_and_are_seeded(tmp_path):
    run = make_run(tmp_path)
    cards = export_datasets([run], tmp_path / "out", seed=7)
    trials = {}
    for task in ("parser", "value_miner"):
        for split in ("train", "validation", "test"):
            rows = [
                json.loads(x) for x in (tmp_path / "out" / task / f"{split}.jsonl").read_text().splitlines()
            ]
            trials.setdefault(split, set()).update(r["trial_id"] for r in rows)
    assert not trials["train"] & trials["validation"] and not trials["train"] & trials["test"]
    assert not trials["validation"] & trials["test"]  # across both tasks: one assignment
    assert all(trials[s] for s in trials)
    again = export_datasets([run], tmp_path / "out2", seed=7)
    other = export_datasets([run], tmp_path / "out3", seed=8)
    assert again["value_miner"]["counts"] == cards["value_miner"]["counts"]
    for task in ("parser", "value_miner"):
        a = (tmp_path / "out" / task / "test.jsonl").read_text()
        assert a == (tmp_path / "out2" / task / "test.jsonl").read_text()
    assert (tmp_path / "out" / "parser" / "test.jsonl").read_text() != (
        tmp_path / "out3" / "parser" / "test.jsonl"
    ).read_text() or other["parser"]["counts"] != cards["parser"]["counts"]


def test_trial_and_patient_split_keeps_patients_apart(tmp_path):
    run = make_run(tmp_path, n_trials=40, n_patients=30, seed=3)
    export_datasets([run], tmp_path / "out", split_by="trial+patient", fractions=(0.6, 0.2, 0.2))
    seen = {}
    for split in ("train", "validation", "test"):
        rows = [
            json.loads(x)
            for x in (tmp_path / "out" / "value_miner" / f"{split}.jsonl").read_text().splitlines()
        ]
        seen[split] = {r["patient_id"] for r in rows}
    assert not seen["train"] & seen["test"] and not seen["train"] & seen["validation"]


def test_dataset_dict_rows_and_card(tmp_path):
    from datasets import load_from_disk

    run = make_run(tmp_path, n_trials=10)
    cards = export_datasets([run], tmp_path / "out")
    dd = load_from_disk(str(tmp_path / "out" / "value_miner"))
    assert set(dd) == {"train", "validation", "test"}
    row = dd["train"][0]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert json.loads(row["messages"][2]["content"]) == {"n": json.loads(row["messages"][2]["content"])["n"]}
    assert (
        row["task"] == "value_miner"
        and row["patient_id"].startswith("pat-")
        and row["record_id"].startswith("run-a:")
    )
    assert row["stage"] in ("miner_inclusion", "miner_exclusion") and row["prompt_version"].startswith(
        row["stage"]
    )
    parser = load_from_disk(str(tmp_path / "out" / "parser"))
    assert parser["train"][0]["patient_id"] is None
    card = json.loads((tmp_path / "out" / "value_miner" / "dataset_card.json").read_text())
    assert card == json.loads(json.dumps(cards["value_miner"]))
    assert sum(card["counts"].values()) == sum(len(dd[s]) for s in dd) == card["records"]["accepted"]
    assert (
        card["rejection_reasons"] == {"evidence": card["records"]["rejected"]}
        and card["records"]["rejected"] > 0
    )
    assert card["teachers"] == {"teacher-a": card["records"]["accepted"]}
    assert set(card["prompt_versions"]) == {"miner_inclusion@v1", "miner_exclusion@v1"}
    pcard = cards["parser"]
    assert (
        pcard["rejection_reasons"] == {"unsatisfiable": 1}
        and pcard["by_stage"]["parser"]["rejection_rate"] == 0.1
    )
    assert "no trial is in two splits" in (tmp_path / "out" / "parser" / "README.md").read_text()


def test_duplicate_prompts_across_runs_are_dropped(tmp_path):
    a = make_run(tmp_path, "run-a", n_trials=6)
    b = make_run(tmp_path, "run-b", n_trials=6)
    cards = export_datasets([a, b], tmp_path / "out")
    assert cards["parser"]["records"]["duplicates_dropped"] == 5
    assert sum(cards["parser"]["counts"].values()) == 5


def test_split_counts():
    assert split_counts(10, (0.8, 0.1, 0.1)) == (8, 1, 1)
    assert split_counts(3, (0.8, 0.1, 0.1)) == (1, 1, 1)
    assert split_counts(2, (0.8, 0.1, 0.1)) == (2, 0, 0)
    assert split_counts(5, (1.0, 0.0, 0.0)) == (5, 0, 0)


def test_export_cli_errors(tmp_path):
    cli = [sys.executable, "-m", "verdict", "teacher", "export"]
    r = subprocess.run(
        [*cli, str(tmp_path / "nothing"), "--out", str(tmp_path / "o")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "no teacher run" in r.stderr
    run = make_run(tmp_path, n_trials=4)
    r = subprocess.run(
        [*cli, str(run), "--out", str(tmp_path / "o"), "--split", "0.5,0.5"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "three comma-separated fractions" in r.stderr
    r = subprocess.run([*cli, str(run), "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 0 and "value_miner: train" in r.stdout
    r = subprocess.run([*cli, str(run), "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and "--overwrite" in r.stderr


@pytest.mark.parametrize("seed", range(5))
def test_assignment_is_a_function_of_trial(tmp_path, seed):
    from verdict.data_gen.records import Record

    recs = [
        Record(
            record_id=f"r{i}",
            stage="parser",
            task="parser",
            trial_id=f"T{i % 9}",
            patient_id=None,
            status="accepted",
            reason=None,
            problems=[],
            teacher="t",
            model="m",
            prompt_version="v",
            messages=[],
            output_json="{}",
            program_json=None,
            prompt_tokens=0,
            completion_tokens=0,
            cost_usd=0,
            calls_paid=0,
            cache_hits=0,
            attempts=1,
            repaired=False,
        )
        for i in range(40)
    ]
    split = assign_splits(recs, seed, (0.8, 0.1, 0.1))
    assert set(split) == {f"T{i}" for i in range(9)} and set(split.values()) == {
        "train",
        "validation",
        "test",
    }
