"""Scoring a student (verdict.train.eval): output checks, atom agreement, the core's decision agreement,
resumable sharded generation, and the end-to-end report of a trained tiny student."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from verdict.train.eval import EvalError, Target, check_output, compare, evaluate, same_value, score
from verdict.train.eval_config import EvalConfig
from verdict.train.run_dir import RunDir
from verdict.train.sft_config import TrainConfig

from tests.fixtures.sft import compact, parsed_trial
from tests.support import REPO


def test_check_output_grades_json_and_schema_validity():
    ok = check_output("value_miner", '{"values":[{"atom":"age_years","value":45,"evidence":"45-year-old"}]}')
    assert (ok.json_ok, ok.schema_ok, ok.reason) == (True, True, None)
    assert ok.parsed.values[0].value == 45
    bad_json = check_output("value_miner", '{"values":[')
    assert (bad_json.json_ok, bad_json.schema_ok, bad_json.reason) == (False, False, "json")
    wrong = check_output("value_miner", '{"values":[{"atom":"age_years","value":"old"}]}')
    assert (wrong.json_ok, wrong.schema_ok, wrong.reason) == (True, False, "schema")
    assert wrong.error.startswith("values.0.value")
    parser = check_output("parser", compact(parsed_trial("NCT0001")))
    assert parser.schema_ok and parser.parsed is not None
    assert not check_output("parser", compact({"atoms": [], "cohorts": []})).schema_ok


def test_schema_valid_means_what_the_formalizer_checks():
    """One meaning of schema_valid: an output the formalizer rejects as "schema" is not schema-valid
    here either (an empty interval passes the raw JSON-Schema check, not the output model)."""
    from verdict.core.program import load_program
    from verdict.data_gen.formalizer import check_miner_output

    text = '{"values":[{"atom":"age_years","value":null,"bounds":{"lo":80,"hi":18},"evidence":"age"}]}'
    c = check_output("value_miner", text)
    program = load_program({"trial_id": "NCT0001", **parsed_trial("NCT0001")})
    formalizer = check_miner_output(text, "stop", program, ["age_years"], "age", max_tokens=100)
    assert formalizer.reason == c.reason == "schema"
    assert c.json_ok and not c.schema_ok


def test_same_value_does_not_confuse_booleans_with_numbers():
    assert same_value(45, 45.0) and same_value(True, True) and same_value(None, None)
    assert not same_value(True, 1) and not same_value(0, False) and not same_value(None, 0)


def _target(tmp_path, sft_export_dir, task) -> Target:
    cfg = TrainConfig(
        name=f"hand-{task}",
        task=task,
        base_model=str(tmp_path / "unused"),
        datasets=[{"path": str(sft_export_dir / task)}],
        output_dir=str(tmp_path),
    ).resolved()
    run = RunDir(tmp_path / cfg.name)
    return Target(run=run, cfg=cfg)


def _predict(target: Target, split: str, outputs: dict[str, str]) -> None:
    spec = target.cfg.datasets[0]
    d = target.run.eval_dir(spec.label, split)
    d.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"record_id": k, "output": v, "new_tokens": 10, "seconds": 0.5, "batch_size": 2})
        for k, v in outputs.items()
    ]
    (d / "predictions.jsonl").write_text("\n".join(lines) + "\n")


def _teacher(sft_export_dir, task, split) -> dict[str, str]:
    from datasets import load_from_disk

    return {
        r["record_id"]: r["messages"][2]["content"] for r in load_from_disk(str(sft_export_dir / task))[split]
    }


def test_teacher_outputs_score_perfectly(sft_export_dir, tmp_path):
    t = _target(tmp_path, sft_export_dir, "value_miner")
    _predict(t, "test", _teacher(sft_export_dir, "value_miner", "test"))
    spec = t.cfg.datasets[0]
    r = score(t, spec.path, spec.label, "test", EvalConfig())
    assert r["records"] == 4 and r["exact_match"]["rate"] == 1.0
    full = {"k": 4, "n": 4, "rate": 1.0, "ci95": [pytest.approx(0.5101, abs=1e-4), 1.0]}  # Wilson, 4 of 4
    assert r["validity"] == {"json_valid": full, "schema_valid": full}
    assert r["atoms"]["value_agreement"]["rate"] == r["atoms"]["status_agreement"]["rate"] == 1.0
    d = r["decisions"]
    assert d["available"] and d["pairs"] == 2 and d["agreement"]["rate"] == 1.0
    # P4 (62, after a stroke) vs NCT0006 (>= 60, no stroke): ineligible; P2 (70, diabetes unknown)
    # vs NCT0001 (>= 18, no diabetes): eligible under prescreen (the open atom is an assumption)
    assert d["confusion"] == {"eligible": {"eligible": 1}, "ineligible": {"ineligible": 1}}
    # 4 records x 10 tokens; each batch of 2 took 0.5 s -> 1 s in all
    assert (
        r["performance"]["tokens_per_second"] == 40.0
        and r["performance"]["latency_per_record_s"]["mean"] == 0.5
    )
    assert (t.run.eval_dir(spec.label, "test") / "report.md").read_text().startswith("# Student eval")


def test_student_mistakes_show_in_atoms_and_decisions(sft_export_dir, tmp_path):
    t = _target(tmp_path, sft_export_dir, "value_miner")
    outputs = _teacher(sft_export_dir, "value_miner", "test")
    outputs["miner_exclusion:NCT0006:P4"] = compact(
        {"values": [{"atom": "has_stroke", "value": False, "evidence": "after a stroke"}]}
    )
    outputs["miner_inclusion:NCT0001:P2"] = '{"values":[{"atom":"age_years","value":7'
    _predict(t, "test", outputs)
    spec = t.cfg.datasets[0]
    r = score(t, spec.path, spec.label, "test", EvalConfig())
    assert r["validity"]["json_valid"]["rate"] == 0.75 and r["exact_match"]["rate"] == 0.5
    a = r["atoms"]
    assert {k: v["rate"] if isinstance(v, dict) else v for k, v in a.items()} == {
        "atoms": 4,
        "value_agreement": 0.5,
        "status_agreement": 0.75,
        "evidence_agreement": 0.75,
        "missing_atoms": 1,
        "extra_atoms": 0,
    }
    assert (a["value_agreement"]["k"], a["value_agreement"]["n"]) == (2, 4)
    d = r["decisions"]
    # the wrong stroke value flips P4 to eligible; P2 stays eligible (age unknown is still open)
    assert d["pairs"] == 2 and d["agreement"]["rate"] == 0.5
    assert d["confusion"] == {"eligible": {"eligible": 1}, "ineligible": {"eligible": 1}}


def test_parser_student_is_judged_by_the_decisions_its_program_gives(sft_export_dir, tmp_path):
    t = _target(tmp_path, sft_export_dir, "parser")
    dropped_exclusion = parsed_trial("NCT0006")
    dropped_exclusion["cohorts"][0]["exclusion"] = []
    _predict(t, "test", {"parser:NCT0006": compact(dropped_exclusion)})
    spec = t.cfg.datasets[0]
    r = score(t, spec.path, spec.label, "test", EvalConfig())
    assert r["validity"]["program_valid"]["rate"] == 1.0 and r["exact_match"]["rate"] == 0.0
    assert r["atoms"]["atom_f1"] == 1.0 and r["atoms"]["criterion_formula_agreement"]["rate"] == 0.5
    # teacher values for (P4, NCT0006) come from the value_miner dataset beside it; without the
    # exclusion the stroke no longer excludes P4
    assert r["decisions"]["confusion"] == {"ineligible": {"eligible": 1}}

    undeclared = parsed_trial("NCT0006")
    undeclared["cohorts"][0]["exclusion"][0]["formula"] = "has_heart_attack"
    _predict(t, "test", {"parser:NCT0006": compact(undeclared)})
    r = score(t, spec.path, spec.label, "test", EvalConfig())
    assert r["validity"]["schema_valid"]["rate"] == 1.0 and r["validity"]["program_valid"]["rate"] == 0.0
    assert r["decisions"]["confusion"] == {"ineligible": {"invalid_output": 1}}


def test_report_p95_and_rates_are_the_shared_definitions(sft_export_dir, tmp_path):
    t = _target(tmp_path, sft_export_dir, "value_miner")
    spec = t.cfg.datasets[0]
    d = t.run.eval_dir(spec.label, "test")
    d.mkdir(parents=True, exist_ok=True)
    outputs = _teacher(sft_export_dir, "value_miner", "test")
    (d / "predictions.jsonl").write_text(
        "".join(
            json.dumps({"record_id": k, "output": v, "new_tokens": 10, "seconds": float(i), "batch_size": 1})
            + "\n"
            for i, (k, v) in enumerate(outputs.items(), 1)
        )
    )
    r = score(t, spec.path, spec.label, "test", EvalConfig())
    assert r["performance"]["latency_per_record_s"]["p95"] == 3.85  # interpolated (nearest-rank: 4.0)
    assert r["exact_match"]["ci95"] == [pytest.approx(0.5101, abs=1e-4), 1.0]
    assert "| json valid | 1.000 [0.510, 1.000] |" in (d / "report.md").read_text()


def test_predictions_torn_by_a_kill_are_resumed_without_losing_a_record(sft_export_dir, tmp_path):
    """Killed between two writes: r1 complete, r2 half-written. The resumed run appends r2 and the
    rest; every record has its prediction (the old reader lost r2 to the glued line)."""
    from verdict.train.eval import Prediction, prediction_file, prediction_store, read_predictions

    t = _target(tmp_path, sft_export_dir, "value_miner")
    spec = t.cfg.datasets[0]
    d = t.run.eval_dir(spec.label, "test")
    d.mkdir(parents=True, exist_ok=True)
    preds = [
        Prediction(record_id=k, output=v, new_tokens=10, seconds=0.5, batch_size=1)
        for k, v in _teacher(sft_export_dir, "value_miner", "test").items()
    ]
    path = prediction_file(d, 0, 1)
    r2 = preds[1].model_dump_json() + "\n"
    path.write_text(preds[0].model_dump_json() + "\n" + r2[: len(r2) // 2])
    done = read_predictions(d)
    assert list(done) == [preds[0].record_id]
    with prediction_store(path) as store:  # how `generate` appends what is missing
        store.append_many([p for p in preds if p.record_id not in done])
    assert sorted(read_predictions(d)) == sorted(p.record_id for p in preds)
    r = score(t, spec.path, spec.label, "test", EvalConfig())
    assert r["records"] == 4 and r["exact_match"]["rate"] == 1.0


def test_missing_companion_and_missing_predictions(sft_export_dir, tmp_path):
    t = _target(tmp_path, sft_export_dir, "value_miner")
    spec = t.cfg.datasets[0]
    outputs = _teacher(sft_export_dir, "value_miner", "test")
    _predict(t, "test", dict(list(outputs.items())[:3]))
    with pytest.raises(EvalError, match="1 of 4 records have no prediction yet"):
        score(t, spec.path, spec.label, "test", EvalConfig())
    _predict(t, "test", outputs)
    r = score(t, spec.path, spec.label, "test", EvalConfig(programs=str(tmp_path / "nowhere")))
    assert r["decisions"] == {
        "available": False,
        "reason": f"no parser dataset at '{tmp_path / 'nowhere'}' (set 'programs' in the eval config)",
    }


@pytest.mark.slow
def test_sharded_generation_resumes_and_reports_once_complete(tiny_value_miner_run, sft_export_dir):
    cfg = EvalConfig(max_new_tokens=128, batch_size=2)
    lines: list[str] = []
    ds = str(sft_export_dir / "value_miner")
    evaluate(
        tiny_value_miner_run,
        "test",
        cfg,
        datasets=[ds],
        shard=1,
        num_shards=2,
        do_report=False,
        progress=lines.append,
    )
    assert "2 to generate" in lines[0]
    with pytest.raises(EvalError, match="2 of 4 records have no prediction yet"):
        evaluate(tiny_value_miner_run, "test", cfg, datasets=[ds], do_generate=False)
    evaluate(
        tiny_value_miner_run,
        "test",
        cfg,
        datasets=[ds],
        shard=0,
        num_shards=2,
        do_report=False,
        progress=lines.append,
    )
    lines.clear()
    reports = evaluate(
        tiny_value_miner_run, "test", cfg, datasets=[ds], progress=lines.append
    )  # unsharded rerun
    assert "4 of 4 records already done, 0 to generate" in lines[0]
    out = RunDir(tiny_value_miner_run).eval_dir("public/value_miner", "test")
    assert sorted(p.name for p in out.glob("predictions*")) == [
        "predictions.shard-0-of-2.jsonl",
        "predictions.shard-1-of-2.jsonl",
    ]
    assert reports[0]["records"] == 4 and reports[0]["validity"]["json_valid"]["rate"] is not None
    # predictions made with other settings are never mixed in
    with pytest.raises(
        EvalError, match=r"made with other settings \(differ in: max_new_tokens\); pass --fresh"
    ):
        evaluate(tiny_value_miner_run, "test", EvalConfig(max_new_tokens=64), datasets=[ds])
    with pytest.raises(EvalError, match="made with max_new_tokens=128, not 64"):
        evaluate(
            tiny_value_miner_run, "test", EvalConfig(max_new_tokens=64), datasets=[ds], do_generate=False
        )


@pytest.mark.slow
def test_generation_killed_between_two_writes_resumes_with_every_record(tiny_value_miner_run, sft_export_dir):
    """The issue's reproduction through `generate` itself: a run killed while writing r2 (r1 kept,
    r2 half-written, r3 and r4 never written). The rerun generates r2-r4 and the report scores all."""
    cfg = EvalConfig(max_new_tokens=128, batch_size=4)
    ds = str(sft_export_dir / "value_miner")
    evaluate(
        tiny_value_miner_run, "test", cfg, datasets=[ds], do_report=False, fresh=True, progress=lambda m: None
    )
    path = RunDir(tiny_value_miner_run).eval_dir("public/value_miner", "test") / "predictions.jsonl"
    r1, r2 = path.read_text().splitlines(keepends=True)[:2]
    path.write_text(r1 + r2[: len(r2) // 2])
    lines: list[str] = []
    reports = evaluate(tiny_value_miner_run, "test", cfg, datasets=[ds], progress=lines.append)
    assert "1 of 4 records already done, 3 to generate" in lines[0]
    assert reports[0]["records"] == 4
    assert len(path.read_text().splitlines()) == 4


@pytest.mark.slow
def test_trained_tiny_student_reproduces_its_teacher_end_to_end(tiny_value_miner_run, tmp_path):
    """Acceptance: trained through the same code path, the tiny student reproduces the teacher's
    exact outputs on its training records under greedy decoding; the eval report runs end to end."""
    cli = [
        sys.executable,
        "-c",
        "from verdict.cli import main; main()",
        "train",
        "eval",
        "--run",
        str(tiny_value_miner_run),
        "--set",
        "max_new_tokens=128",
        "--set",
        "batch_size=8",
    ]
    out = subprocess.run(cli + ["--split", "train"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["records"] == 8 and summary["exact_match"] == 1.0
    assert summary["json_valid"] == summary["schema_valid"] == 1.0
    assert summary["atoms"]["value_agreement"] == 1.0 and summary["decision_agreement"] == 1.0
    assert summary["decision_pairs"] == 4 and summary["tokens_per_second"] > 0
    # patient text stays in the run directory, never in the logs
    assert "year-old" not in out.stderr and "year-old" not in out.stdout

    test = subprocess.run(cli + ["--split", "test"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert test.returncode == 0, test.stderr[-2000:]
    report_dir = RunDir(tiny_value_miner_run).eval_dir("public/value_miner", "test")
    report = json.loads((report_dir / "report.json").read_text())
    assert report["records"] == 4 and report["decisions"]["pairs"] == 2
    assert "decision agreement (2 pairs, prescreen v1)" in (report_dir / "report.md").read_text()

    table = compare([str(tiny_value_miner_run)], "train")
    assert "| tiny-vm | public/value_miner | 8 | 1.000 | 1.000 | 1.000 | 1.000 |" in table


def test_eval_refuses_a_run_without_adapter(tmp_path):
    from verdict.train.eval import open_target
    from verdict.train.run_dir import RunError

    with pytest.raises(RunError, match="does not exist"):
        open_target(tmp_path / "nope")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text(
        Path(REPO / "configs/train/parser.yaml").read_text() + "name: r\n"
    )
    with pytest.raises(RunError, match="has no adapter yet"):
        open_target(tmp_path / "r")
