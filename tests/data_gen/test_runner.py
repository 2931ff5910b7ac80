"""`verdict teacher run` end to end against the scripted server, as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from verdict.data_gen.scripted_server import Match, Rule, Script, ScriptedServer
from verdict.data_gen.scripted_server import ScriptedResponse as R

from tests.support import VERDICT

from .teacher_data import (
    leaks,
    parser_script,
    patient,
    program,
    trial_id,
    write_inputs,
    write_run,
    write_teacher,
)

CLI = VERDICT


def verdict(*args, timeout=120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def records(run_dir: Path) -> list[tuple]:
    db = sqlite3.connect(run_dir / "records.sqlite")
    try:
        return db.execute(
            "SELECT record_id, status, reason, output_json FROM records ORDER BY record_id"
        ).fetchall()
    finally:
        db.close()


def items(recs: list[tuple]) -> list[tuple]:
    """The records of whole items (a trial's program, a miner pass), not those of their calls."""
    return [x for x in recs if "#" not in x[0]]


def cache_rows(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.fixture
def setup(tmp_path, scripted_server):
    """3 trials, 3 patients, every pair; valid parser answers, null miner answers."""
    inputs = write_inputs(tmp_path, 3, 3)
    scripted_server.set_script(parser_script(3, bad_first={1}))
    teacher = write_teacher(tmp_path, scripted_server.url)
    cfg = write_run(tmp_path, teacher, inputs)
    return tmp_path, cfg, scripted_server


def test_run_records_every_item_and_a_rerun_pays_nothing(setup):
    tmp, cfg, srv = setup
    r = verdict("teacher", "run", "-c", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "complete" in r.stdout
    recs = records(tmp / "runs" / "test-run")
    # per trial: the assembled program + one row per criterion call; per miner item: the merged
    # result + one row per chunk call
    assert len(recs) == 3 * (1 + 3) + 3 * 3 * 2 * 2 and all(x[1] == "accepted" for x in recs)
    parsed = {x[0]: json.loads(x[3]) for x in recs if x[0].startswith("parser:") and "#" not in x[0]}
    assert (
        parsed[f"parser:{trial_id(1)}"]["cohorts"][0]["inclusion"][1]["formula"] == "has_condition_1"
    )  # repaired
    calls = {x[0]: json.loads(x[3]) for x in recs if x[0].startswith("parser:") and "#" in x[0]}
    assert calls[f"parser:{trial_id(1)}#inc-2"] == {
        "in_scope": True,
        "atoms": [
            {
                "name": "has_condition_1",
                "domain": "bool",
                "kind": "diagnosis",
                "definition": "The patient has a diagnosis of condition 1.",
            }
        ],
        "formula": "has_condition_1",
    }
    sent = len(srv.requests)
    # criterion calls: "Adults aged 18 or older" and "Pregnancy" recur in the three trials (one call
    # each), "Diagnosis of condition i" is each trial's own, plus one repair; 9 inclusion passes; the
    # exclusion atoms are the same in every trial, so each patient's exclusion prompt is one call
    assert sent == (2 + 3 + 1) + 9 + 3
    assert len(set(x.request_id for x in srv.requests)) == sent

    from verdict.data_gen.export import export_datasets

    cards = export_datasets([tmp / "runs" / "test-run"], tmp / "ds")
    # one SFT row per criterion call; a recurring criterion is one prompt, exported once
    assert sum(cards["parser"]["counts"].values()) == 5 and cards["parser"]["records"]["repaired"] == 1
    assert cards["parser"]["records"]["duplicates_dropped"] == 4
    # each patient's exclusion prompt is identical for the three trials: exported once
    assert cards["value_miner"]["records"]["duplicates_dropped"] == 6
    row = json.loads((tmp / "ds" / "parser" / "train.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["record_id"].startswith("test-run:parser:") and "#" in row["record_id"]
    assert json.loads(row["messages"][2]["content"]) == calls[row["record_id"].split(":", 1)[1]]
    assert "Synthetic trial" not in row["messages"][1]["content"]

    again = verdict("teacher", "run", "-c", cfg, "--no-progress")
    assert again.returncode == 0 and len(srv.requests) == sent
    # another run over the same inputs and cache: every call is a cache hit
    other = write_run(
        tmp,
        tmp / "scripted-test.yaml",
        {"trials": tmp / "trials.jsonl", "patients": tmp / "patients.jsonl"},
        name="other-run",
    )
    r3 = verdict("teacher", "run", "-c", other, "--no-progress")
    assert r3.returncode == 0 and len(srv.requests) == sent
    assert "28 cache hits" in r3.stdout  # 9 criterion calls + the repair call + 18 miner calls

    stats = json.loads(verdict("teacher", "stats", tmp / "runs" / "other-run", "--json").stdout)
    assert stats["calls"] == {"paid": 0, "cache_hits": 28, "unanswered_in_flight": 0}
    s1 = json.loads(verdict("teacher", "stats", tmp / "runs" / "test-run", "--json").stdout)
    assert s1["calls"] == {"paid": 18, "cache_hits": 10, "unanswered_in_flight": 0}
    assert s1["stages"]["parser"]["repaired"] == 1 and s1["stages"]["parser"]["records"] == 9
    assert s1["stages"]["parser (assembled)"]["records"] == 3
    assert s1["cost_usd"] > 0 and s1["tokens"]["prompt"] > 0


def test_dry_run_sends_nothing(setup):
    tmp, cfg, srv = setup
    r = verdict("teacher", "run", "-c", cfg, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert len(srv.requests) == 0 and srv.connections == 0
    total = [line for line in r.stdout.splitlines() if line.strip().startswith("total")][0].split()
    # items, cached, calls: 9 criterion calls of which 4 repeat a criterion of another trial, 18 miner passes
    assert total[1:4] == ["27", "4", "23"]
    parser = [line for line in r.stdout.splitlines() if line.strip().startswith("parser")][0].split()
    assert parser[1:4] == ["9", "4", "5"]
    assert float(total[-1]) > 0
    assert verdict("teacher", "run", "-c", cfg, "--no-progress").returncode == 0
    r = verdict("teacher", "run", "-c", cfg, "--dry-run")
    assert [line.split()[1:4] for line in r.stdout.splitlines() if line.strip().startswith("total")] == [
        ["0", "0", "0"]
    ]


def test_budget_stops_before_exceeding(tmp_path, scripted_server):
    inputs = write_inputs(tmp_path, 3, 2)
    scripted_server.set_script(parser_script(3))
    teacher = write_teacher(
        tmp_path,
        scripted_server.url,
        concurrency=2,
        max_tokens={"parser": 400, "miner_inclusion": 200, "miner_exclusion": 200},
        prices={"input_per_million": 50.0, "output_per_million": 50.0},
    )
    cfg = write_run(tmp_path, teacher, inputs)
    budget = 0.15  # the whole run costs about $0.30; one call at most about $0.08
    r = verdict("teacher", "run", "-c", cfg, "--budget-usd", budget, "--no-progress")
    assert r.returncode == 3, r.stderr
    assert "budget stop" in r.stderr and "--budget-usd" in r.stderr
    cache = tmp_path / "runs" / "cache.sqlite"
    spent = cache_rows(cache, "SELECT SUM(cost_usd) FROM ledger WHERE kind = 'paid'")[0][0]
    paid_first = len(scripted_server.requests)
    assert 0 < paid_first < 9 and spent <= budget
    r = verdict("teacher", "run", "-c", cfg, "--budget-usd", 100, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert len(items(records(tmp_path / "runs" / "test-run"))) == 3 + 3 * 2 * 2
    ids = [x.request_id for x in scripted_server.requests]
    assert len(ids) == len(set(ids))  # nothing paid twice across the stop


def test_resume_after_kill_9_repeats_no_answered_call(tmp_path):
    n_trials, n_patients, conc = 5, 4, 3
    inputs = write_inputs(tmp_path, n_trials, n_patients)
    with ScriptedServer(parser_script(n_trials, latency=0.12)) as srv:
        teacher = write_teacher(tmp_path, srv.url, concurrency=conc)
        cfg = write_run(tmp_path, teacher, inputs)
        cache = tmp_path / "runs" / "cache.sqlite"
        proc = subprocess.Popen(
            [*CLI, "teacher", "run", "-c", str(cfg), "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            if cache.exists():
                try:
                    if cache_rows(cache, "SELECT COUNT(*) FROM calls")[0][0] >= 12:
                        break
                except sqlite3.OperationalError:
                    pass
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        answered = {k for (k,) in cache_rows(cache, "SELECT key FROM calls")}
        in_flight = {k for (k,) in cache_rows(cache, "SELECT key FROM inflight")}
        assert 12 <= len(answered) < n_trials + 2 * n_trials * n_patients
        assert in_flight and not in_flight & answered

        r = verdict("teacher", "run", "-c", cfg, "--no-progress")
        assert r.returncode == 0, r.stderr
        assert "in flight" in r.stderr
        counts = Counter(x.request_id for x in srv.requests)
        repeated = {k for k, c in counts.items() if c > 1}
        assert not repeated & answered  # no call whose answer was stored was ever sent again
        assert repeated <= in_flight and max(counts.values()) <= 2
        recs = records(tmp_path / "runs" / "test-run")
        assert len(items(recs)) == n_trials + 2 * n_trials * n_patients and all(
            x[1] == "accepted" for x in recs
        )
        db = sqlite3.connect(tmp_path / "runs" / "test-run" / "records.sqlite")
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        db.close()
        assert cache_rows(cache, "SELECT COUNT(*) FROM inflight")[0][0] == 0
        assert cache_rows(cache, "SELECT COUNT(*) FROM calls")[0][0] == len(counts)


def test_patient_text_never_reaches_logs(tmp_path):
    """Run with verbose logging through rejections, endpoint errors that echo the note, and a
    malformed input row; scan everything written except the on-site stores."""
    inputs = write_inputs(tmp_path, 2, 3)
    with open(inputs["patients"], "a") as f:
        f.write('{"_id": "broken", "text": 42}\n{not json\n')
    notes = [patient(j).text for j in range(3)]
    echo = f"context too long: '{notes[1]}'"
    script = parser_script(2)
    script.rules = [
        Rule(
            match=Match(contains=[notes[0].split(".")[0], "has_condition_0"]),  # evidence not in the note
            responses=[
                R(
                    content={
                        "values": [
                            {"atom": "age_years", "value": 30, "evidence": "thirty years old"},
                            {"atom": "has_condition_0", "value": None, "evidence": ""},
                        ]
                    }
                )
            ],
        ),
        Rule(
            match=Match(contains=[notes[1].split(".")[0], "is_pregnant"]),
            responses=[R(fault="status", status=400, message=echo)],
        ),
    ] + script.rules
    log_file = tmp_path / "server.log"
    with ScriptedServer(script, log_path=log_file) as srv:
        teacher = write_teacher(tmp_path, srv.url)
        cfg = write_run(tmp_path, teacher, inputs)
        r = verdict("teacher", "run", "-c", cfg, "--verbose")
        assert r.returncode == 1  # the 400 items failed; everything else is recorded
        assert "patients.jsonl:4" in r.stderr and "patients.jsonl:5" in r.stderr  # bad rows reported by line
        assert "evidence" in (tmp_path / "runs" / "test-run" / "run.log").read_text()
        stats = verdict("teacher", "stats", tmp_path / "runs" / "test-run")
    written = [
        r.stdout,
        r.stderr,
        stats.stdout,
        (tmp_path / "runs" / "test-run" / "run.log").read_text(),
        log_file.read_text(),
    ]
    for text in written:
        assert not leaks(text, notes), leaks(text, notes)[:3]
    assert "withheld" in r.stderr


def test_endpoint_failures_leave_items_for_the_next_run(tmp_path, scripted_server):
    inputs = write_inputs(tmp_path, 3, 1)
    script = parser_script(3)
    own = "Diagnosis of condition 2"  # trial 2's own criterion: its endpoint error fails that trial only
    script.rules.insert(0, Rule(match=Match(contains=[own]), responses=[R(fault="status", status=503)]))
    scripted_server.set_script(script)
    cfg = write_run(tmp_path, write_teacher(tmp_path, scripted_server.url, max_retries=1), inputs)
    r = verdict("teacher", "run", "-c", cfg, "--no-progress")
    assert r.returncode == 1 and "incomplete" in r.stdout and "run the same command again" in r.stderr
    assert len(items(records(tmp_path / "runs" / "test-run"))) == 2 + 2 * 2
    scripted_server.set_script(parser_script(3))
    before = len(scripted_server.requests)
    r = verdict("teacher", "run", "-c", cfg, "--no-progress")
    assert r.returncode == 0 and len(items(records(tmp_path / "runs" / "test-run"))) == 3 + 3 * 2
    # the retry pays for the failed criterion and trial 2's inclusion pass; its other criteria and
    # its exclusion pass (the same prompt as the other trials') come from the cache
    assert [x for x in scripted_server.requests[before:] if own in str(x.body)]
    assert len(scripted_server.requests) - before == 1 + 1


def test_wrong_key_stops_the_run_with_a_clear_error(tmp_path, scripted_server):
    inputs = write_inputs(tmp_path, 3, 1)
    scripted_server.set_script(Script(default=R(fault="status", status=401, message="invalid api key")))
    cfg = write_run(tmp_path, write_teacher(tmp_path, scripted_server.url), inputs)
    r = verdict("teacher", "run", "-c", cfg, "--no-progress")
    assert (
        r.returncode == 2 and "error:" in r.stderr and "HTTP 401" in r.stderr and "Traceback" not in r.stderr
    )
    assert len(scripted_server.requests) <= 4 * 3  # stops at once (calls already in flight finish: the
    # criteria of the trials being parsed)


def test_pairs_select_what_is_mined(tmp_path, scripted_server):
    inputs = write_inputs(tmp_path, 2, 3, pairs=[(0, 0), (0, 2), (1, 1), (5, 1)])
    scripted_server.set_script(parser_script(2))
    cfg = write_run(
        tmp_path, write_teacher(tmp_path, scripted_server.url), inputs, stages=["parser", "miner_exclusion"]
    )
    r = verdict("teacher", "run", "-c", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr
    ids = [x[0] for x in items(records(tmp_path / "runs" / "test-run"))]
    assert sorted(ids) == sorted(
        [
            f"parser:{trial_id(0)}",
            f"parser:{trial_id(1)}",
            f"miner_exclusion:{trial_id(0)}:synth-0",
            f"miner_exclusion:{trial_id(0)}:synth-2",
            f"miner_exclusion:{trial_id(1)}:synth-1",
        ]
    )


def test_bad_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nteachers: {parser: scripted}\ntrials: {path: t.jsonl}\nbudget: 3\n")
    r = verdict("teacher", "run", "-c", bad)
    assert r.returncode == 2 and "unknown config key 'budget' (did you mean 'budget_usd'?)" in r.stderr
    assert "Traceback" not in r.stderr
    r = verdict("teacher", "run", "-c", "no-such-run")
    assert r.returncode == 2 and "no teacher_runs config named 'no-such-run'" in r.stderr
    missing = tmp_path / "m.yaml"
    missing.write_text(
        f"name: x\nteachers: {{parser: scripted}}\nstages: [parser]\n"
        f"trials: {{path: {tmp_path / 'nope.jsonl'}}}\n"
    )
    r = verdict("teacher", "run", "-c", missing)
    assert r.returncode == 2 and "no such file" in r.stderr
    assert program(0)  # keep the helper import honest
