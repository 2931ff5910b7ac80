"""Before anything slow starts: every missing input named in one run with its absolute path, `device:
gpu` refused without CUDA (with the memory the config needs), the API's address checked first."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import yaml
from verdict.serve.preflight import PreflightError, check_address, check_vllm, cuda_devices
from verdict.serve.vllm.config import VLLMConfig
from verdict.serve.vllm.gpu_sizing import QWEN25_7B

from tests.serve.conftest import verdict_command
from tests.serve.test_vllm_config import write_adapter
from tests.support import REPO


def test_every_missing_input_is_listed_in_one_run(tmp_path):
    cfg = VLLMConfig(
        model=str(tmp_path / "no-model"),
        adapters={"parser": str(tmp_path / "runs" / "parser"), "value_miner": str(tmp_path / "vm")},
        python=sys.executable,
    )
    with pytest.raises(PreflightError) as e:
        check_vllm(cfg)
    assert e.value.problems == [
        f"base model folder {tmp_path / 'no-model'} does not exist",
        f"adapter 'parser': adapter folder {tmp_path / 'runs' / 'parser'} does not exist",
        f"adapter 'value_miner': adapter folder {tmp_path / 'vm'} does not exist",
    ]


def qwen_like_model(folder):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    return folder


def test_gpu_device_without_cuda_is_refused_with_the_memory_needed(tmp_path):
    if cuda_devices():
        pytest.skip("this machine has a CUDA GPU")
    cfg = VLLMConfig(
        model=str(qwen_like_model(tmp_path / "m")),
        adapters={"parser": str(write_adapter(tmp_path / "a", 32))},
        device="gpu",
        dtype="bfloat16",
        max_model_len=4096,
        max_num_seqs=8,
        python=sys.executable,
    )
    with pytest.raises(PreflightError) as e:
        check_vllm(cfg)
    (problem,) = e.value.problems
    assert "no CUDA GPU" in problem and "weights 14.2 GiB" in problem and "x 32768 tokens" in problem


def test_a_held_address_is_named_with_host_and_port():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(PreflightError, match=f"cannot listen on 127.0.0.1:{port}"):
            check_address("127.0.0.1", port)


def test_serve_up_checks_the_api_side_before_vllm(tmp_path):
    """The port is taken and every vLLM input is missing: the API's address is reported first,
    before vLLM's inputs are even looked at; then, port free, all missing inputs in one run."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = tmp_path / "s.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "vllm": {"model": "models/base", "adapters": {"parser": "runs/students/parser"}},
                    "api": {"port": port, "audit_db": "a.sqlite", "api_keys": "keys.json"},
                }
            )
        )
        up = [*verdict_command(), "serve", "up", "--config", str(cfg), "--init"]
        r = subprocess.run(up, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and f"127.0.0.1:{port}" in r.stderr, r.stderr
    assert "starting vLLM" not in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        up[:-1] + ["--set", "api.port=0"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"audit store {tmp_path / 'a.sqlite'} does not exist" in r.stderr
    assert f"API key file {tmp_path / 'keys.json'} does not exist" in r.stderr
    r = subprocess.run(
        up + ["--set", "api.port=0", "--set", f"vllm.python={sys.executable}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 2 and "starting vLLM" not in r.stderr
    assert f"base model folder {tmp_path / 'models' / 'base'} does not exist" in r.stderr
    assert f"adapter folder {tmp_path / 'runs' / 'students' / 'parser'} does not exist" in r.stderr
    assert f"audit store: {tmp_path / 'a.sqlite'}" in r.stderr  # the files it uses, by absolute path
