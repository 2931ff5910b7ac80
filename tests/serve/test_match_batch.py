"""`verdict match batch`: planning, sharding by trial, resuming after a crash, merging without
duplicates; and the whole thing as a job array on the real local SLURM cluster with CPU vLLM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from verdict.serve.batch.match_batch import (
    load_plan,
    merge_results,
    plan_batch,
    read_results,
    result_path,
    run_shard,
    shard_of,
)
from verdict.serve.errors import BatchError

from tests.fixtures.vllm import (
    MAX_MODEL_LEN,
    STUDENT_MAX_TOKENS,
    vllm_available,
    vllm_python,
    write_student_inputs,
)
from tests.serve.conftest import verdict_command
from tests.serve.test_app import core_decision
from tests.support import REPO, need


def write_serve_config(folder: Path, base: Path, adapters: dict[str, Path]) -> Path:
    cfg = {
        "vllm": {
            "model": str(base),
            "adapters": {k: str(v) for k, v in adapters.items()},
            "dtype": "float32",
            "max_model_len": MAX_MODEL_LEN,
            "ready_timeout_s": 600,
        },
        "api": {
            "formalizer": {"max_tokens": STUDENT_MAX_TOKENS, "timeout_s": 300},
            "api_keys": str(folder / "keys.json"),
            "limits": {"batch_concurrency": 4},
        },
    }
    path = folder / "batch-serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def expected_decisions(records: dict) -> dict[tuple[str, str], dict]:
    return {
        (p["patient_id"], t["trial_id"]): json.loads(
            core_decision(records, t["trial_id"], p)[2].canonical_json()
        )
        for t in records["trials"]
        for p in records["patients"]
    }


def test_plan_shards_by_trial_and_refuses_a_changed_plan(tmp_path, student_records):
    inputs = write_student_inputs(tmp_path / "in", student_records)
    cfg = write_serve_config(tmp_path, tmp_path, {})
    plan = plan_batch(tmp_path / "b", name="b", serve_config=cfg, shards=3, **inputs)
    assert plan.counts == {"patients": 3, "trials": 2, "pairs": 6}
    assert load_plan(tmp_path / "b") == plan
    assert plan_batch(tmp_path / "b", name="b", serve_config=cfg, shards=3, **inputs) == plan  # same: resume
    with pytest.raises(BatchError, match="different batch plan"):
        plan_batch(tmp_path / "b", name="b", serve_config=cfg, shards=2, **inputs)
    assert shard_of("NCT-DM-01", 3) == shard_of("NCT-DM-01", 3) and {
        shard_of(f"T{i}", 3) for i in range(50)
    } == {0, 1, 2}
    pairs = tmp_path / "in" / "pairs.jsonl"
    pairs.write_text('{"patient_id": "P1", "nct_id": "NCT-DM-01"}\n{"patient_id": "P9", "nct_id": "NCT-X"}\n')
    with pytest.raises(BatchError) as e:
        plan_batch(tmp_path / "c", name="c", serve_config=cfg, pairs=pairs, **inputs)
    assert "patient 'P9'" in str(e.value) and "trial 'NCT-X'" in str(e.value)


def scripted_serve_config(folder: Path) -> Path:
    """folder/serve.yaml: a serve config whose formalizer is the scripted server (no vLLM is started)."""
    cfg = {
        "vllm": {"model": str(folder / "unused")},
        "api": {
            "formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"},
            "api_keys": str(folder / "keys.json"),
        },
    }
    (folder / "serve.yaml").write_text(yaml.safe_dump(cfg))
    return folder / "serve.yaml"


def scripted_batch(folder: Path, name: str, patient_lines: list[str]) -> Path:
    """folder/out: a planned batch of one trial (NCT01: adults, no chest pain, as the scripted parser
    reads it) against these patients, over `scripted_serve_config`."""
    (folder / "patients.jsonl").write_text("".join(line + "\n" for line in patient_lines))
    (folder / "trials.jsonl").write_text(
        json.dumps({"nct_id": "NCT01", "title": "t", "inclusion": "Adults", "exclusion": "Chest pain"}) + "\n"
    )
    out = folder / "out"
    plan_batch(
        out,
        name=name,
        serve_config=scripted_serve_config(folder),
        patients=folder / "patients.jsonl",
        trials=folder / "trials.jsonl",
    )
    return out


def test_a_result_line_torn_by_a_kill_is_redone_and_nothing_is_lost(tmp_path):
    """Killed between two writes (r1 kept, r2 half-written, r3 never written), against the scripted
    formalizer (real HTTP): the resumed shard redoes r2 and r3, every line of its own."""
    import asyncio

    from verdict.data_gen.scripted_server import Script, ScriptedServer

    from tests.serve.test_serving import SCRIPT

    patients = [json.dumps({"_id": f"P{i}", "text": f"Patient {i}, {30 + i} years old."}) for i in range(3)]
    out = scripted_batch(tmp_path, "torn", patients)
    with ScriptedServer(Script.model_validate(SCRIPT)) as srv:
        assert asyncio.run(run_shard(out, 0, formalizer_url=srv.url))["matched"] == 3
        path = result_path(out, 0)
        r1, r2 = path.read_text().splitlines(keepends=True)[:2]
        path.write_text(r1 + r2[: len(r2) // 2])
        again = asyncio.run(run_shard(out, 0, formalizer_url=srv.url))
    assert again["done_before"] == 1 and again["matched"] == 2
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and sorted(r.patient_id for r in read_results(path)) == ["P0", "P1", "P2"]
    summary = merge_results(out)
    assert summary["results"] == 3 and summary["ranked"] == {"pairs": 3, "unranked": 0}
    # what the decided pairs sent, summed from their lines (each line carries its pair's cost)
    merged = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    sent = sum(m["cost"]["mining"]["calls"] for m in merged)
    assert summary["cost"]["pairs"] == 3 and summary["cost"]["calls"] == sent > 0
    assert summary["cost"]["calls_per_pair"] == round(sent / 3, 2)
    # site-wide screening: the trial's patients ranked by formal distance, each with its decision id
    (by_trial,) = map(json.loads, (out / "ranked_by_trial.jsonl").read_text().splitlines())
    ranked = by_trial["rows"]
    assert by_trial["trial_id"] == "NCT01" and sorted(r["patient_id"] for r in ranked) == ["P0", "P1", "P2"]
    assert [r["rank"] for r in ranked] == [1, 2, 3] and all(r["decision_id"] and r["reason"] for r in ranked)
    by_patient = [json.loads(x) for x in (out / "ranked_by_patient.jsonl").read_text().splitlines()]
    assert [g["patient_id"] for g in by_patient] == ["P0", "P1", "P2"] and all(
        len(g["rows"]) == 1 for g in by_patient
    )


def test_fhir_records_go_through_the_batch_with_their_coded_facts(tmp_path):
    """Patients as `verdict fhir load --out` writes them: the batch decides the age from the Patient's
    birth date (no miner call asks it), the rest from the documents; a broken record is named by id."""
    import asyncio

    from verdict.data_gen.fhir.models import FhirPatientRecord
    from verdict.data_gen.formalizer.protocol import NoteDocument
    from verdict.data_gen.scripted_server import Script, ScriptedServer
    from verdict.data_gen.sources import load_patients

    from tests.serve.test_screen import asked as screen_asked
    from tests.serve.test_serving import SCRIPT

    rec = FhirPatientRecord(
        patient_id="F1",
        reference_date="2024-06-01",
        birth_date="1980-02-03",
        age_years=44,
        documents=[NoteDocument(id="DocumentReference/d1", text="Seen today. No chest pain.")],
    )
    broken = {
        "format": "verdict.fhir_patient/v1",
        "patient_id": "F2",
        "reference_date": "2024-06-01",
        "facts": [{"secret": "Zyx"}],
    }
    (tmp_path / "broken.jsonl").write_text(json.dumps(broken) + "\n")
    (problem,) = load_patients(tmp_path / "broken.jsonl").problems
    assert "broken.jsonl:1: FHIR record of patient 'F2' is invalid" in problem and "Zyx" not in problem
    out = scripted_batch(tmp_path, "fhir", [rec.model_dump_json()])
    with ScriptedServer(Script.model_validate(SCRIPT)) as srv:
        assert asyncio.run(run_shard(out, 0, formalizer_url=srv.url))["matched"] == 1
        asked = screen_asked(srv, "No chest pain")
    assert (
        "has_chest_pain" in asked and "age_years" not in asked
    )  # the age comes from the birth date, not mined
    (line,) = read_results(result_path(out, 0))
    assert line.status == 200, line.error
    merge_results(out)
    (row,) = map(json.loads, (out / "results.jsonl").read_text().splitlines())
    assert row["patient_id"] == "F1" and row["decision"] in ("eligible", "ineligible", "undetermined")


@pytest.mark.slow
@pytest.mark.vllm
def test_shards_resume_after_a_crash_and_merge_without_duplicates(
    tmp_path, student_records, vllm_server, student_base_dir, student_adapters
):
    inputs = write_student_inputs(tmp_path / "in", student_records)
    cfg = write_serve_config(tmp_path, student_base_dir, student_adapters)
    out = tmp_path / "batch"
    plan_batch(out, name="resume", serve_config=cfg, shards=3, **inputs)
    url = vllm_server.base_url
    counts = [_run(out, s, url) for s in range(3)]
    assert sum(c["matched"] for c in counts) == 6 and sum(c["pairs"] for c in counts) == 6
    assert sorted(c["pairs"] for c in counts) == [0, 3, 3]  # sharded by trial: each trial in one shard
    first = merge_results(out)
    assert first["results"] == 6 and first["missing"] == 0 and first["duplicates_dropped"] == 0
    expected = expected_decisions(student_records)
    got = {
        (r["patient_id"], r["trial_id"]): r
        for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
    }
    assert {k: v["result"] for k, v in got.items()} == expected

    # a crash: the last line of a shard lost half-written, and a rerun of the other shard's lines
    busy, other = [s for s in range(3) if read_results(result_path(out, s))]
    path = result_path(out, busy)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    again = _run(out, busy, url)
    assert again["matched"] == 1 and again["done_before"] == again["pairs"] - 1  # only the lost pair
    other = result_path(out, other)
    other.write_text(other.read_text() * 2)  # the same results appended twice
    merged = merge_results(out)
    assert merged["results"] == 6 and merged["missing"] == 0 and merged["duplicates_dropped"] >= 1
    got = {
        (r["patient_id"], r["trial_id"]): r["result"]
        for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
    }
    assert got == expected
    assert _run(out, busy, url)["matched"] == 0  # nothing left to do


def batch_command(cfg: Path, inputs: dict[str, Path], out: Path, *extra: str) -> list[str]:
    """`verdict match batch` over the inputs in 3 shards on the local SLURM cluster."""
    return [
        *verdict_command(),
        "match",
        "batch",
        "--config",
        str(cfg),
        "--patients",
        str(inputs["patients"]),
        "--trials",
        str(inputs["trials"]),
        "--out",
        str(out),
        "--shards",
        "3",
        "--slurm",
        "local",
        *extra,
    ]


def _run(out: Path, shard: int, url: str) -> dict:
    import asyncio

    return asyncio.run(run_shard(out, shard, formalizer_url=url))


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.slurm
def test_batch_as_a_job_array_on_the_real_slurm_cluster(
    tmp_path, slurm_cluster, student_records, student_base_dir, student_adapters
):
    need(vllm_available(), f"vLLM environment missing ({vllm_python()})")
    inputs = write_student_inputs(tmp_path / "in", student_records)
    cfg = write_serve_config(tmp_path, student_base_dir, student_adapters)
    out = tmp_path / "batch"
    cmd = batch_command(
        cfg,
        inputs,
        out,
        "--slurm-set",
        f"log_dir={tmp_path / 'slurm-logs'}",
        "--slurm-set",
        "jobs.serve.mem=5G",
        "--wait",
        "--timeout",
        "1500",
    )
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=slurm_cluster.env(), timeout=1800)
    logs = "\n".join(p.read_text()[-3000:] for p in (tmp_path / "slurm-logs").glob("*.out"))
    assert r.returncode == 0, r.stderr[-3000:] + logs
    submitted, report = r.stdout.split("\n", 1)  # the job ids, then the final report
    assert set(json.loads(submitted)) == {"array", "merge"}
    report = json.loads(report)
    assert set(report["jobs"].values()) == {"COMPLETED"} and report["summary"]["missing"] == 0
    script = (out / "slurm" / "match.sbatch").read_text()
    assert "#SBATCH --array=0-2" in script and "#SBATCH --gres=gpu:1" in script
    got = {
        (r["patient_id"], r["trial_id"]): r["result"]
        for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
    }
    assert got == expected_decisions(student_records)
    assert "pairs done" in r.stderr  # progress while waiting
    # each trial went to its own shard, which started its own vLLM; the third shard had nothing to do
    worked = [s for s in range(3) if read_results(result_path(out, s))]
    assert len(worked) == 2 and all((out / "shards" / str(s) / "vllm.log").exists() for s in worked)


def test_render_only_writes_the_array_and_the_merge_job(tmp_path, student_records):
    inputs = write_student_inputs(tmp_path / "in", student_records)
    cfg = write_serve_config(tmp_path, tmp_path, {})
    out = tmp_path / "batch"
    cmd = batch_command(cfg, inputs, out, "--no-submit")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "6 pairs (3 patients x 2 trials) in 3 shard(s)" in r.stderr
    array = (out / "slurm" / "match.sbatch").read_text()
    assert "#SBATCH --array=0-2" in array and "#SBATCH --gres=gpu:1" in array
    assert f'verdict match worker --out {out.resolve()} --shard "${{SLURM_ARRAY_TASK_ID:-0}}"' in array
    merge = (out / "slurm" / "match-merge.sbatch").read_text()
    assert "--array" not in merge and f"verdict match merge --out {out.resolve()}" in merge
    status = subprocess.run(
        [*verdict_command(), "match", "status", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert status.stdout.split("\n")[:3] == ["shard 0: 0/3", "shard 1: 0/0", "shard 2: 0/3"]
    bad = subprocess.run(
        [*cmd[:-1], "--policy", "nope", "--no-submit"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "nope" in bad.stderr
