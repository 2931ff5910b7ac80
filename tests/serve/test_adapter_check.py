"""`verdict serve check-adapter`: the same golden set through vLLM and through PEFT/transformers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from verdict.serve.errors import AdapterCheckError
from verdict.serve.vllm.adapter_check import (
    AdapterCheckConfig,
    first_difference,
    load_golden,
    run_adapter_check,
)
from verdict.serve.vllm.config import VLLMConfig

from tests.fixtures.vllm import student_vllm_config
from tests.serve.conftest import verdict_command
from tests.support import REPO


def test_golden_set_errors_name_the_line(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text('{"messages": [{"role": "user", "content": "x"}]}\nnot json\n{"messages": []}\n')
    with pytest.raises(AdapterCheckError) as e:
        load_golden(p)
    assert "g.jsonl:2: not valid JSON" in str(e.value) and "g.jsonl:3: needs 'messages'" in str(e.value)
    with pytest.raises(AdapterCheckError, match="not found"):
        load_golden(tmp_path / "missing.jsonl")


def test_first_difference():
    assert first_difference("abc", "abc") is None
    assert first_difference("abc", "abd") == 2
    assert first_difference("ab", "abc") == 2


def test_several_adapters_need_records_with_their_task(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}], "task": "parser"}) + "\n")
    cfg = VLLMConfig(model="m", adapters={"parser": "a", "value_miner": "b"})
    with pytest.raises(AdapterCheckError, match="no golden records with task \\['value_miner'\\]"):
        run_adapter_check(cfg, AdapterCheckConfig(golden=str(p), base_url="http://127.0.0.1:9/v1"))
    with pytest.raises(AdapterCheckError, match="not in the serve config"):
        run_adapter_check(cfg, AdapterCheckConfig(golden=str(p), adapters=["nope"]))


def golden(export: Path, tmp_path: Path) -> Path:
    p = tmp_path / "golden.jsonl"
    p.write_text(
        (export / "parser" / "train.jsonl").read_text() + (export / "value_miner" / "train.jsonl").read_text()
    )
    return p


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serves_the_trained_adapters_like_peft(tmp_path, vllm_server, student_export_dir):
    result = run_adapter_check(
        vllm_server.config,
        AdapterCheckConfig(
            golden=str(golden(student_export_dir, tmp_path)), base_url=vllm_server.base_url, max_tokens=400
        ),
    )
    assert result.passed
    by = {a.adapter: a for a in result.adapters}
    # one parser record per criterion; the value miner's 12 note records and 4 on the chart's fact sheet
    assert (by["parser"].total, by["value_miner"].total) == (6, 16)
    for a in result.adapters:
        assert a.agree == a.total and a.json_equal == a.total
        assert a.teacher_match == a.total  # and both reproduce the teacher's records


@pytest.mark.slow
@pytest.mark.vllm
def test_an_adapter_served_differently_is_caught(
    tmp_path, vllm_server, student_export_dir, student_base_dir, student_adapters
):
    """vLLM serves the real parser; the reference side loads another adapter under that name, as when
    vLLM silently serves something other than what PEFT runs. The CLI reports it and exits 1."""
    wrong = {"parser": student_adapters["value_miner"], "value_miner": student_adapters["value_miner"]}
    cfg = student_vllm_config(student_base_dir, wrong, tmp_path / "unused.log")
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"vllm": cfg.model_dump(mode="json")}))
    report = tmp_path / "report.json"
    r = subprocess.run(
        [
            *verdict_command(),
            "serve",
            "check-adapter",
            "--config",
            str(path),
            "--golden",
            str(student_export_dir / "parser" / "train.jsonl"),
            "--adapter",
            "parser",
            "--base-url",
            vllm_server.base_url,
            "--max-tokens",
            "64",
            "--report",
            str(report),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert "parser: 0/6 records identical" in r.stdout and "DISAGREES" in r.stdout  # one per criterion
    assert "first difference at character" in r.stdout
    data = json.loads(report.read_text())
    assert data["passed"] is False and data["adapters"][0]["records"][0]["vllm_output"].startswith(
        '{"in_scope"'
    )
