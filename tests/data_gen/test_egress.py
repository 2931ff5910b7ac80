"""The egress allowlist: patient text only to loopback or allowed hosts, refused before a byte."""

import asyncio
import subprocess
import sys

import pytest
from verdict.core.program import TrialProgram, check_program
from verdict.data_gen.formalizer import Formalizer
from verdict.data_gen.formalizer.egress import EgressPolicy, is_loopback
from verdict.data_gen.formalizer.endpoint_config import EgressConfig, EndpointConfig
from verdict.data_gen.formalizer.errors import EgressRefused
from verdict.data_gen.scripted_server import Script, ScriptedResponse, ScriptedServer

from .teacher_data import (
    leaks,
    patient,
    program,
    trial_id,
    write_inputs,
    write_run,
    write_teacher,
)


@pytest.mark.parametrize(
    "host, ok",
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.1", False),
        ("api.openai.com", False),
        ("localhost.evil.com", False),
        ("0.0.0.0", False),
    ],
)
def test_loopback(host, ok):
    assert is_loopback(host) is ok


def test_allowlist_rules():
    p = EgressPolicy(
        allow_loopback=False, allow_hosts=("gpu-node-3.hospital.local", "*.lab.hospital.org", "10.8.0.0/16")
    )
    assert p.host_allowed("gpu-node-3.hospital.local") and p.host_allowed("x.lab.hospital.org")
    assert p.host_allowed("10.8.3.4") and not p.host_allowed("10.9.0.1")
    assert not p.host_allowed("lab.hospital.org.evil.com") and not p.host_allowed("127.0.0.1")


def test_refusal_names_the_rule_and_the_fix():
    p = EgressPolicy.from_config(EgressConfig(), env=False)
    with pytest.raises(EgressRefused) as e:
        p.check("https://api.openai.com/v1", carries_patient_text=True, what="stage 'miner_inclusion'")
    msg = str(e.value)
    assert "api.openai.com" in msg and "loopback" in msg and "egress.allow_hosts" in msg
    assert "VERDICT_EGRESS_ALLOW" in msg and "data_class" in msg and "Nothing was sent" in msg
    # public/synthetic datasets and trial-only stages may use API teachers
    p.check("https://api.openai.com/v1", carries_patient_text=True, data_class="public")
    p.check("https://api.openai.com/v1", carries_patient_text=False)
    # a proxy is a destination too
    with pytest.raises(EgressRefused, match="proxy 'proxy.corp.com'"):
        p.check("http://127.0.0.1:8000/v1", carries_patient_text=True, via_proxy="http://proxy.corp.com:3128")


def test_environment_extends_the_allowlist(monkeypatch):
    monkeypatch.setenv("VERDICT_EGRESS_ALLOW", "gateway.hospital.local, *.gpu.hospital.local")
    p = EgressPolicy.from_config(EgressConfig())
    assert p.host_allowed("gateway.hospital.local") and p.host_allowed("n1.gpu.hospital.local")


def test_refused_before_a_byte_is_sent():
    """A real server on 127.0.0.2; a policy that allows only 127.0.0.1 must not even connect."""
    prog = check_program(TrialProgram(trial_id=trial_id(0), **program(0)))
    with ScriptedServer(Script(default=ScriptedResponse(auto="nulls")), host="127.0.0.2") as srv:
        t = EndpointConfig(name="t", base_url=srv.url, model="m", max_retries=0)

        async def mine(policy):
            fz = Formalizer(t, egress=policy)
            try:
                return await fz.mine_values(prog, patient(0), "exclusion", data_class="private")
            finally:
                await fz.aclose()

        strict = EgressPolicy(allow_loopback=False, allow_hosts=("127.0.0.1",))
        with pytest.raises(EgressRefused, match="127.0.0.2"):
            asyncio.run(mine(strict))
        assert srv.connections == 0 and srv.requests == []
        # trial parsing carries no patient text: allowed under the same policy
        fz = Formalizer(t, egress=strict)
        assert fz.client.check_egress(carries_patient_text=False, data_class="private", what="x") is None
        allowed = EgressPolicy(allow_loopback=False, allow_hosts=("127.0.0.2",))
        assert asyncio.run(mine(allowed)).status == "accepted"
        assert srv.connections == 1


def test_run_with_private_notes_and_an_api_teacher_is_refused(tmp_path):
    inputs = write_inputs(tmp_path, 1, 2)
    teacher = write_teacher(tmp_path, "https://api.openai.com/v1")
    cfg = write_run(tmp_path, teacher, inputs, data_class="private")
    r = subprocess.run(
        [sys.executable, "-m", "verdict", "teacher", "run", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: refused")
    assert "api.openai.com" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()  # refused before the run even started
    assert not leaks(r.stderr + r.stdout, [patient(j).text for j in range(2)])
