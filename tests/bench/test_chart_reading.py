"""The bench's chart_reading stage (bench/chart_reading.py): read once against exhaustive mining of the
same long charts, on the scripted OpenAI-compatible server (real HTTP).

Two reference patients (sigir-201410: one program; sigir-201530: two variants of one trial, so its
reading is shared by two programs), each SIGIR note among other trials' criteria texts (about 2,500
tokens: above the reading threshold). The recorded programs come from the run's `recorded` backend;
the server replays the recorded values only when their quote is in the note it was sent and plays a
reader that keeps every recorded quote it is shown (`bench/long_charts.reference_script`), or, in
the second test, one that drops a single excerpt.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
import yaml
from verdict.bench.bench_config import load_bench_config
from verdict.bench.long_charts import load_recorded_pairs, reference_script
from verdict.bench.protocol import BenchError
from verdict.bench.runner import BenchRun
from verdict.data_gen.formalizer.checks import split_pieces
from verdict.data_gen.scripted_server import ScriptedServer

from tests.support import BENCHMARKS, REFERENCE_V6, SHARED_DATA, VERDICT

PATIENTS = ["sigir-201410", "sigir-201530"]
ROW = "scripted-reader"


@pytest.fixture(scope="module")
def pairs():
    notes = {}
    for line in (BENCHMARKS / "patients_sigir.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["_id"] in PATIENTS:
            notes[row["_id"]] = row["text"]
    out = load_recorded_pairs(REFERENCE_V6, notes)
    assert [p.case for p in out] == ["NCT00667381", "NCT00398242a", "NCT00398242b"]
    return out


def write_config(tmp_path, url, **chart):
    cfg = {
        "name": "charts",
        "purpose": "machinery_check",
        "out_dir": str(tmp_path / "runs"),
        "cache": str(tmp_path / "cache.sqlite"),
        "dataset": {
            "kind": "sigir",
            "pairs": str(SHARED_DATA / "reference" / "gold_5sys_freeform_balanced.json"),
            "patients": str(BENCHMARKS / "patients_sigir.jsonl"),
            "trials": [str(BENCHMARKS / "trials.jsonl")],
            "data_class": "public",
            "require_text": False,
            "patient_ids": PATIENTS,
        },
        "backends": [{"name": "recorded", "kind": "recorded", "path": str(REFERENCE_V6)}],
        "chart_reading": {
            "enabled": True,
            "miners": [
                {
                    "name": ROW,
                    "programs": "recorded",
                    "miner": {
                        "name": "scripted",
                        "base_url": url,
                        "model": "recorded",
                        "limits": "paper",
                        "timeout_s": 30,
                        "max_retries": 1,
                        "backoff_base_s": 0.05,
                    },
                }
            ],
            "charts": {
                "source": "filler",
                "filler_trials": str(BENCHMARKS / "trials.jsonl"),
                "filler_tokens": 2500,
            },
            **chart,
        },
    }
    path = tmp_path / "charts.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(cfg, **kw):
    return asyncio.run(
        BenchRun(load_bench_config(str(cfg)), progress_bar=False, progress=lambda m: None, **kw).run()
    )


def records(out) -> list[dict]:
    return [json.loads(x) for x in (out.run_dir / "chart_reading.jsonl").read_text().splitlines()]


def test_read_once_agrees_where_the_reader_misses_nothing_costs_counted_rerun_pays_nothing(tmp_path, pairs):
    with ScriptedServer(reference_script(pairs)) as srv:
        out = run(write_config(tmp_path, srv.url))
        assert out.status == "complete", out.message
        s = json.loads((out.run_dir / "results.json").read_text())
        row = s["chart_reading"]["rows"][ROW]
        assert (row["pairs"], row["programs"], row["patients"], row["charts_read"]) == (2, 3, 2, 2)
        assert row["atom_agreement"]["rate"] == 1.0 and row["atoms"] == row["atom_agreement"]["n"]
        assert row["categories"]["miss"]["k"] == 0 and row["categories"]["same"]["k"] > 0
        assert row["same_decision"]["k"] == row["same_tier"]["k"] == 3
        assert s["chart_reading"]["listed"] == []
        # costs: every call the server answered is counted once, by the method that sent it
        recs = records(out)
        readings = {r["patient_id"]: r["reading"] for r in recs if r.get("reading")}
        assert len(readings) == 2 and all(w["calls"] > 0 for w in readings.values())
        sent = sum(
            r["exhaustive"]["mining"].get("sent", 0) + r["read_once"]["mining"].get("sent", 0) for r in recs
        )
        assert sent + sum(w.get("sent", 0) for w in readings.values()) == len(srv.requests)
        # the two variants share one reading: exactly one of them paid it
        assert sorted(r.get("reading_reused", False) for r in recs if r["patient_id"] == "sigir-201530") == [
            False,
            True,
        ]
        c = row["cost"]
        assert c["exhaustive"]["calls"] > c["read_once_mining"]["calls"] > 0
        assert c["exhaustive"]["prompt_tokens"] > c["read_once_projected"]["prompt_tokens"]
        # amortized over 1.5 programs per patient here, over 300 trials in the projection
        reading = c["reading_per_patient"]
        assert c["read_once_run"]["calls"] == pytest.approx(
            c["read_once_mining"]["calls"] + 2 * reading["calls"] / 3, abs=0.01
        )
        assert c["read_once_projected"]["calls"] == pytest.approx(
            c["read_once_mining"]["calls"] + reading["calls"] / 300, abs=0.01
        )
        report = (out.run_dir / "report.md").read_text()
        assert "## Read once vs exhaustive mining (long charts)" in report
        assert "Machinery check: a scripted server replays recorded values" in report
        assert f"| {ROW} | 2 | 3 | {row['atoms']} | 1.000 ({row['atoms']}/{row['atoms']};" in report
        assert "amortized over 300 trials" in report
        cmp = subprocess.run(
            [*VERDICT, "bench", "compare", str(out.run_dir), str(out.run_dir)], capture_output=True, text=True
        )
        assert cmp.returncode == 0 and cmp.stdout.count(f"| {ROW} | 2 | 1.000 (") == 2
        # a rerun skips what is recorded; a restart answers every call from the cache: no request sent
        n = len(srv.requests)
        again = run(out.run_dir / "config.yaml")
        assert again.status == "complete" and len(srv.requests) == n and len(records(again)) == 3
        fresh = run(out.run_dir / "config.yaml", restart=True)
        assert len(srv.requests) == n
        s2 = json.loads((fresh.run_dir / "results.json").read_text())
        assert s2["chart_reading"]["rows"][ROW]["cost"] == c  # cached calls count as the calls they were
        assert all(r["exhaustive"]["mining"].get("sent", 0) == 0 for r in records(fresh))


def _droppable(pairs):
    """A recorded quote that exactly one atom of one program cites, with pieces no other quote of the
    patient holds, and an atom no other program has: dropping its excerpt must miss only that atom."""
    for p in pairs:
        others = [q for x in pairs if x.patient_id == p.patient_id for q in x.quotes()]
        for atom, v in p.values.items():
            q = v.get("evidence")
            if not q or others.count(q) != 1 or any(atom in x.values for x in pairs if x is not p):
                continue
            rest = [piece for o in others if o != q for piece in split_pieces(o)]
            if not any(a in b or b in a for a in split_pieces(q) for b in rest):
                return p, atom, q
    raise AssertionError("no droppable quote")


def test_a_reader_that_drops_one_excerpt_makes_exactly_that_atom_a_miss(tmp_path, pairs):
    p, atom, quote = _droppable(pairs)
    with ScriptedServer(reference_script(pairs, drop_quotes=[quote])) as srv:
        out = run(write_config(tmp_path, srv.url))
    s = json.loads((out.run_dir / "results.json").read_text())
    row = s["chart_reading"]["rows"][ROW]
    assert row["categories"]["miss"]["k"] == 1
    assert row["atom_agreement"]["k"] == row["atoms"] - 1
    assert s["chart_reading"]["listed"] == [
        {"row": ROW, "pair": p.pair_id, "case": p.case, "atom": atom, "category": "miss"}
    ]
    rec = next(r for r in records(out) if r["case"] == p.case)
    assert rec["atoms"][atom] == "miss"
    report = (out.run_dir / "report.md").read_text()
    assert f"| {ROW} | {p.pair_id} | {p.case} | {atom} | miss |" in report
    assert quote not in report  # atom names and ids only: no chart text


def test_a_miner_row_needs_a_recorded_backend(tmp_path):
    cfg = write_config(tmp_path, "http://127.0.0.1:9/v1")
    data = yaml.safe_load(cfg.read_text())
    data["chart_reading"]["miners"][0]["programs"] = "nonesuch"
    cfg.write_text(yaml.safe_dump(data))
    with pytest.raises(BenchError, match="'nonesuch' is not a recorded backend"):
        run(cfg)


def test_fhir_charts_from_a_folder_of_bundles_and_a_bulk_export(tmp_path):
    from verdict.bench.chart_reading import fhir_charts

    from tests.fixtures.fhir_server.data import AT, topic_resources, write_bundle, write_ndjson

    ids = ["trec-202129", "trec-202124"]
    (tmp_path / "bundles").mkdir()
    for pid in ids:
        write_bundle(tmp_path / "bundles" / f"{pid}.json", topic_resources([pid]))
    write_ndjson(tmp_path / "bulk", topic_resources(ids))
    for source in ("bundles", "bulk"):
        charts, problems = fhir_charts(str(tmp_path / source), AT, "private")
        assert sorted(charts) == sorted(ids) and problems == []
        assert all(c.data_class == "private" and c.documents for c in charts.values())
    with pytest.raises(BenchError, match="does not exist"):
        fhir_charts(str(tmp_path / "nowhere"), AT, "private")
