"""VLLMConfig and serve configs: rank derivation from the adapters, interpreter choice, strict keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verdict.serve.config import load_serve_config
from verdict.serve.errors import ServeConfigError
from verdict.serve.vllm.config import ENV_PYTHON, VLLMConfig, adapter_rank, vllm_rank_slot

from tests.support import REPO


def write_adapter(d: Path, r: int, rank_pattern: dict | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"r": r, "lora_alpha": 2 * r, "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA"}
    if rank_pattern:
        cfg["rank_pattern"] = rank_pattern
    (d / "adapter_config.json").write_text(json.dumps(cfg))
    return d


def test_rank_comes_from_the_largest_adapter_and_rounds_up_to_a_vllm_slot(tmp_path):
    a = write_adapter(tmp_path / "a", 4)
    b = write_adapter(tmp_path / "b", 16, rank_pattern={"model.layers.0.self_attn.q_proj": 40})
    assert adapter_rank(a) == 4
    assert adapter_rank(b) == 40  # a per-module rank counts too
    assert VLLMConfig(model="m", adapters={"x": str(a)}).lora_rank() == 8
    assert VLLMConfig(model="m", adapters={"x": str(a), "y": str(b)}).lora_rank() == 64
    assert VLLMConfig(model="m").lora_rank() is None


@pytest.mark.parametrize("rank,slot", [(1, 1), (2, 8), (8, 8), (17, 32), (300, 320), (512, 512)])
def test_rank_slots(rank, slot):
    assert vllm_rank_slot(rank) == slot


def test_rank_errors_name_the_problem(tmp_path):
    with pytest.raises(ServeConfigError, match="exceeds the largest rank"):
        vllm_rank_slot(513)
    with pytest.raises(ServeConfigError, match="no adapter_config.json"):
        adapter_rank(tmp_path)
    a = write_adapter(tmp_path / "a", 32)
    with pytest.raises(ServeConfigError, match="below the largest adapter rank"):
        VLLMConfig(model="m", adapters={"a": str(a)}, max_lora_rank=16).lora_rank()
    assert VLLMConfig(model="m", adapters={"a": str(a)}, max_lora_rank=48).lora_rank() == 64


def test_interpreter_config_then_env_then_default(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV_PYTHON, raising=False)
    monkeypatch.chdir(tmp_path)  # no .venv-vllm here: the checkout's is the default
    assert VLLMConfig(model="m").interpreter() == REPO / ".venv-vllm" / "bin" / "python"
    monkeypatch.setenv(ENV_PYTHON, "/opt/vllm/bin/python")
    assert VLLMConfig(model="m").interpreter() == Path("/opt/vllm/bin/python")
    assert VLLMConfig(model="m", python="/x/python").interpreter() == Path("/x/python")


def test_adapter_names_are_checked():
    with pytest.raises(ValueError, match="adapter name"):
        VLLMConfig(model="m", adapters={"a=b": "x"})


def test_shipped_serve_configs_load():
    for name in ("cpu-tiny", "gpu-qwen7b"):
        cfg = load_serve_config(name)
        assert cfg.vllm is not None and cfg.api is not None
        assert set(cfg.vllm.adapters) == {"parser", "value_miner"}
        assert cfg.vllm.structured_outputs.backend == "xgrammar"
        assert cfg.vllm.structured_outputs.disable_any_whitespace


def test_unknown_keys_and_overrides(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("vllm:\n  model: m\n  max_model_lenn: 10\n")
    with pytest.raises(ServeConfigError) as e:
        load_serve_config(p)
    assert "vllm.max_model_lenn" in str(e.value) and "max_model_len" in str(e.value)
    p.write_text("vllm:\n  model: m\n")
    cfg = load_serve_config(p, ["vllm.port=8011", "vllm.device=gpu"])
    assert (cfg.vllm.port, cfg.vllm.device, cfg.name) == (8011, "gpu", "x")
    with pytest.raises(ServeConfigError, match="vllm.prot"):
        load_serve_config(p, ["vllm.prot=1"])
    p.write_text("api:\n  port: 1\n")
    with pytest.raises(ServeConfigError, match="base_url is required"):
        load_serve_config(p)
    with pytest.raises(ServeConfigError, match="no serve config named 'nope'"):
        load_serve_config("nope")
