"""`verdict teacher stats`: records by stage and reason, joined with the cache's ledger."""

import subprocess
import sys

from verdict.data_gen.formalizer.cache import CachedCall, CallCache, CallMeta
from verdict.data_gen.formalizer.protocol import StageResult
from verdict.data_gen.records import RecordStore
from verdict.data_gen.stats import render_stats, run_stats


def test_stats_join_records_and_ledger(tmp_path):
    cache = CallCache(tmp_path / "cache.sqlite")
    meta = CallMeta(run="r1", stage="parser", teacher="t", endpoint="e", model="m", prompt="trial_parser@v1")
    for i, cost in enumerate((0.25, 0.5)):
        cache.store(
            CachedCall(
                key=f"k{i}",
                content="{}",
                finish_reason="stop",
                prompt_tokens=100,
                completion_tokens=10,
                cost_usd=cost,
            ),
            meta,
        )
    cache.record_hit(cache.get("k0"), meta)
    cache.begin("k9", meta)  # a call whose answer never came
    cache.close()
    store = RecordStore(tmp_path / "r1" / "records.sqlite")
    store.set_meta("config", {"name": "r1"})
    store.set_meta("cache", str(tmp_path / "cache.sqlite"))
    store.set_meta("status", "complete")
    base = dict(teacher="t", model="m", prompt_version="trial_parser@v1", messages=[])
    store.put(StageResult(stage="parser", status="accepted", output_json="{}", **base), "NCT1")
    store.put(
        StageResult(stage="parser", status="rejected", reason="unsatisfiable", problems=["x"], **base), "NCT2"
    )
    store.put(
        StageResult(stage="parser", status="rejected", reason="unsatisfiable", problems=["x"], **base), "NCT3"
    )
    store.close()
    s = run_stats(tmp_path / "r1")
    assert s["stages"]["parser"] == {
        "records": 3,
        "accepted": 1,
        "rejected": 2,
        "repaired": 0,
        "rejected_by_reason": {"unsatisfiable": 2},
    }
    assert s["calls"] == {"paid": 2, "cache_hits": 1, "unanswered_in_flight": 1}
    assert s["cost_usd"] == 0.75 and s["tokens"] == {"prompt": 200, "completion": 20}
    text = render_stats(s)
    assert "unsatisfiable 2" in text and "1 sent but unanswered" in text and "$0.7500" in text


def test_unknown_run_is_a_clear_error(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "verdict", "teacher", "stats", "nope", "--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "no teacher run 'nope'" in r.stderr


def test_criteria_figures_count_what_the_criterion_cache_saves(tmp_path):
    import json

    from verdict.data_gen.stats import criteria_figures

    rows = [
        {
            "nct_id": "NCT1",
            "inclusion": "Inclusion Criteria:\n\n- Age 18 or older\n\n- Diabetes",
            "exclusion": "Exclusion Criteria:\n\n- Pregnancy",
        },
        {
            "nct_id": "NCT2",
            "inclusion": "Inclusion Criteria:\n\n- age  18 or older\n\n- Asthma",
            "exclusion": "Exclusion Criteria:\n\n- Pregnancy",
        },
        {"nct_id": "NCT3", "inclusion": "- Pregnancy", "exclusion": "- Pregnancy"},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = criteria_figures([path, path])  # a trial in two files counts once
    assert f["trials"] == 3 and f["criteria"] == 8 and f["headings_dropped"] == 4
    # requests are (side, text): "Pregnancy" on the exclusion side 3x, on the inclusion side once
    assert f["distinct"] == 6 and f["cache_saves"] == 0.25
    assert f["distinct_case_folded"] == 5 and f["distinct_texts_any_side"] == 5
    assert f["most_repeated"][0] == {"side": "exclusion", "text": "Pregnancy", "trials": 3}
    r = subprocess.run(
        [sys.executable, "-m", "verdict", "teacher", "criteria", "--trials", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.splitlines()[-1] == "criteria: trials=3 total=8 distinct=6 saved=0.2500 headings_dropped=4"
    )
