"""`verdict serve` as a demo script drives it: `serve up` brings vLLM and the API up, writes the
ready file, serves a match, and stops both on SIGTERM; `serve openapi` needs no server."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import httpx
import pytest
import yaml
from verdict.serve.api_keys import KeyStore
from verdict.serve.vllm.server import group_alive

from tests.fixtures.vllm import (
    STUDENT_MAX_TOKENS,
    student_vllm_config,
    trial_text,
    vllm_available,
    vllm_python,
)
from tests.serve.conftest import verdict_command
from tests.support import REPO, need


def test_openapi_command_prints_the_schema(tmp_path):
    out = tmp_path / "openapi.json"
    r = subprocess.run(
        [*verdict_command(), "serve", "openapi", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    spec = json.loads(out.read_text())
    assert spec["info"]["title"] == "Verdict matching service" and "/v1/match" in spec["paths"]


@pytest.mark.slow
@pytest.mark.vllm
def test_serve_up_runs_both_and_stops_both(tmp_path, student_base_dir, student_adapters, student_records):
    need(vllm_available(), f"vLLM environment missing ({vllm_python()})")
    vcfg = student_vllm_config(student_base_dir, student_adapters, tmp_path / "vllm.log")
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "vllm": vcfg.model_dump(mode="json"),
                "api": {
                    "port": 0,
                    "formalizer": {"max_tokens": STUDENT_MAX_TOKENS},
                    "audit_db": str(tmp_path / "a.sqlite"),
                    "api_keys": str(tmp_path / "keys.json"),
                    "log_file": str(tmp_path / "api.log"),
                },
            }
        )
    )
    key, _ = KeyStore(tmp_path / "keys.json").add("demo", ["match"])
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [*verdict_command(), "serve", "up", "--config", str(cfg), "--init", "--ready-file", str(ready)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 400
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "not ready in time"
            time.sleep(0.5)
        info = json.loads(ready.read_text())
        t, p = student_records["trials"][0], student_records["patients"][0]
        with httpx.Client(base_url=info["url"], headers={"Authorization": f"Bearer {key}"}, timeout=300) as c:
            r = c.post(
                "/v1/match",
                json={
                    "trial": trial_text(t).model_dump(exclude_none=True),
                    "patient": {"patient_id": p["patient_id"], "note": p["note"]},
                },
            )
        assert r.status_code == 200 and r.json()["decision"]["decision"] == "eligible", r.text
        vllm_pid = next(
            int(line.split("pid=")[1].split(")")[0])
            for line in (tmp_path / "vllm.log").read_text().splitlines()
            if "(APIServer pid=" in line
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "vLLM ready after" in err and "matching API at" in err and "vLLM stopped" in err
    assert not group_alive(vllm_pid, None)
