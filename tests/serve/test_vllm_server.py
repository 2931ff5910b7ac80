"""VLLMServer: the command it runs, readiness, failing fast with the log, stopping the whole group.

Lifecycle logic is exercised with small stand-in executables (real processes, real HTTP) so that it
is fast and deterministic; the real CPU vLLM is started by `test_real_vllm_*` and the session fixture.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from verdict.serve.errors import VLLMServerError
from verdict.serve.vllm.config import VLLMConfig
from verdict.serve.vllm.server import VLLMServer, group_alive, group_members

from tests.fixtures.vllm import vllm_available, vllm_python
from tests.serve.test_vllm_config import write_adapter
from tests.support import REPO, need


def tiny_model_folder(tmp_path: Path) -> Path:
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text("{}")
    return m


def executable(path: Path, body: str) -> Path:
    path.write_text(body)
    path.chmod(0o755)
    return path


def test_command_serves_base_and_adapters_with_structured_outputs(tmp_path):
    a = write_adapter(tmp_path / "parser", 16)
    b = write_adapter(tmp_path / "miner", 32)
    cfg = VLLMConfig(
        model=str(tmp_path / "m"),
        adapters={"parser": str(a), "value_miner": str(b)},
        port=8123,
        max_model_len=1024,
        python="/venv/bin/python",
    )
    cmd = VLLMServer(cfg).command()
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    args = " ".join(cmd)
    assert f"--model {tmp_path / 'm'}" in args and "--served-model-name base" in args
    assert "--port 8123" in args and "--max-model-len 1024" in args
    assert "--enable-lora --max-lora-rank 32 --max-loras 2" in args
    i = cmd.index("--lora-modules")
    assert cmd[i + 1 : i + 3] == [f"parser={a}", f"value_miner={b}"]
    so = json.loads(cmd[cmd.index("--structured-outputs-config") + 1])
    assert so == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert "--enforce-eager" in cmd and "--gpu-memory-utilization" not in cmd
    env = VLLMServer(cfg).environment()
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1" and "PYTHONPATH" not in env

    gpu = VLLMServer(cfg.model_copy(update={"device": "gpu", "adapters": {}, "tensor_parallel_size": 2}))
    gcmd = gpu.command()
    assert "--enforce-eager" not in gcmd and "--enable-lora" not in gcmd
    assert gcmd[gcmd.index("--tensor-parallel-size") + 1] == "2"
    assert "VLLM_TARGET_DEVICE" not in gpu.environment() or os.environ.get("VLLM_TARGET_DEVICE")


def test_free_port_when_port_is_zero(tmp_path):
    s = VLLMServer(VLLMConfig(model="m"))
    assert s.port > 0 and s.base_url == f"http://127.0.0.1:{s.port}/v1"


def test_a_process_that_dies_fails_fast_with_its_log(tmp_path):
    py = executable(
        tmp_path / "python",
        "#!/bin/sh\necho 'loading model'\necho 'RuntimeError: boom in engine' >&2\nexit 3\n",
    )
    cfg = VLLMConfig(
        model=str(tiny_model_folder(tmp_path)),
        python=str(py),
        log_file=str(tmp_path / "v.log"),
        ready_timeout_s=60,
    )
    t0 = time.monotonic()
    with pytest.raises(VLLMServerError) as e:
        VLLMServer(cfg).start()
    assert time.monotonic() - t0 < 10
    assert "exited with code 3" in str(e.value) and "boom in engine" in str(e.value)


def test_not_ready_in_time_stops_the_whole_group(tmp_path):
    # The "server" forks a child that would outlive a plain kill of the leader.
    py = executable(
        tmp_path / "python", '#!/bin/sh\nsleep 300 &\necho $! > "$(dirname $0)/child.pid"\nsleep 300\n'
    )
    cfg = VLLMConfig(model=str(tiny_model_folder(tmp_path)), python=str(py), ready_timeout_s=1.5)
    server = VLLMServer(cfg)
    with pytest.raises(VLLMServerError, match="not ready after"):
        server.start()
    child = int((tmp_path / "child.pid").read_text())
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().split(")")[1][:3]
    )
    assert server.process is None


STANDIN = """#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
names = [args[args.index("--served-model-name") + 1]]
if "--lora-modules" in args:
    names += [m.split("=")[0] for m in args[args.index("--lora-modules") + 1:]
              if "=" in m and not m.startswith("-")]
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"data": [{{"id": n}} for n in names]}}).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_ready_when_models_lists_every_adapter_then_stops(tmp_path):
    py = executable(tmp_path / "python", STANDIN.format(python=sys.executable))
    a = write_adapter(tmp_path / "parser", 8)
    cfg = VLLMConfig(model=str(tiny_model_folder(tmp_path)), adapters={"parser": str(a)}, python=str(py))
    with VLLMServer(cfg) as server:
        assert server.running and sorted(server.models()) == ["base", "parser"]
        pgid = server.process.pid
    assert not group_alive(pgid, None)
    assert server.models() is None


def test_missing_interpreter_or_model_is_a_clear_error(tmp_path):
    from verdict.serve.preflight import PreflightError

    with pytest.raises(PreflightError, match="does not exist: run scripts/setup.sh"):
        VLLMServer(VLLMConfig(model=str(tmp_path), python=str(tmp_path / "nope"))).start()
    with pytest.raises(PreflightError, match="has no config.json"):
        VLLMServer(VLLMConfig(model=str(tmp_path), python=sys.executable)).start()


def verdict(*args: str, **kw) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("verdict")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=REPO, **kw)


def test_cli_print_command_and_errors(tmp_path):
    cfg = tmp_path / "s.yaml"
    a = write_adapter(tmp_path / "p", 8)
    cfg.write_text(f"vllm:\n  model: {tmp_path}\n  adapters: {{parser: {a}}}\n  port: 8200\n")
    r = verdict("serve", "vllm", "--config", str(cfg), "--print-command")
    assert r.returncode == 0 and "--lora-modules parser=" in r.stdout and "--port 8200" in r.stdout
    # what it prints is a shell command: the JSON argument survives a shell's word splitting
    words = shlex.split(r.stdout)
    so = json.loads(words[words.index("--structured-outputs-config") + 1])
    assert so["backend"] == "xgrammar"
    r = verdict("serve", "vllm", "--config", str(cfg), "--set", "vllm.prot=1")
    assert (
        r.returncode == 2
        and "error: " in r.stderr
        and "vllm.prot" in r.stderr
        and "Traceback" not in r.stderr
    )


def random_adapter(base: Path, folder: Path) -> Path:
    """A random (untrained) rank-8 adapter on the base: real LoRA loading, real rank derivation."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from verdict.train.peft_quiet import peft_quietly

    with peft_quietly():  # peft reads transformers' deprecated is_gradient_checkpointing
        get_peft_model(
            AutoModelForCausalLM.from_pretrained(base),
            LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        ).save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.vllm
def test_real_vllm_detached_start_and_stop_through_the_cli(tmp_path, student_base_dir):
    """`verdict serve vllm --detach` brings up a real CPU vLLM; `verdict serve stop` stops every process."""
    need(vllm_available(), f"vLLM environment missing ({vllm_python()})")
    a = random_adapter(student_base_dir, tmp_path / "p")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(
        f"vllm:\n  model: {student_base_dir}\n  adapters: {{parser: {a}}}\n  max_model_len: 512\n"
        f"  log_file: {tmp_path / 'vllm.log'}\n"
    )
    state = tmp_path / "state.json"
    r = verdict("serve", "vllm", "--config", str(cfg), "--detach", "--state-file", str(state), timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads(state.read_text())
    try:
        assert info["models"] == ["base", "parser"] and "vLLM ready after" in r.stderr
        import httpx

        listed = httpx.get(info["base_url"] + "/models", timeout=5).json()["data"]
        assert {m["id"] for m in listed} == {"base", "parser"}
        assert next(m for m in listed if m["id"] == "parser")["parent"] == "base"
    finally:
        r = verdict("serve", "stop", "--state-file", str(state), timeout=120)
    assert r.returncode == 0 and not group_alive(info["pid"], None)


# ---- supervision: a leader that dies (SIGKILL) leaves nothing behind --------------------------------
FORKING_STANDIN = STANDIN.replace(
    "HTTPServer((",
    """import os, subprocess, tempfile
open(os.path.join(tempfile.gettempdir(), "engine.sock"), "w").close()
child = subprocess.Popen(["sleep", "300"])  # an "engine process": outlives a SIGKILL of the leader
open(os.path.join(os.path.dirname(sys.argv[0]), "child.pid"), "w").write(str(child.pid))
HTTPServer((""",
)


def test_supervisor_cleans_up_after_a_sigkilled_leader(tmp_path):
    import signal
    import threading

    from verdict.serve.vllm.server import exit_note

    py = executable(tmp_path / "python", FORKING_STANDIN.format(python=sys.executable))
    cfg = VLLMConfig(model=str(tiny_model_folder(tmp_path)), python=str(py), ready_timeout_s=30)
    server = VLLMServer(cfg).start()
    try:
        tmp_dir = server.tmp_dir
        assert (tmp_dir / "engine.sock").exists()  # the server's temp files go to its own folder
        assert server.state().tmp_dir == str(tmp_dir)
        pgid = server.process.pid
        child = int((tmp_path / "child.pid").read_text())
        assert child in list(group_members(pgid))
        told: list[str] = []
        done = threading.Event()
        server.supervise(lambda m: (told.append(m), done.set()), interval_s=0.1)
        assert exit_note(server.base_url) is None  # running
        os.kill(pgid, signal.SIGKILL)
        assert done.wait(15), "the supervisor did not notice the leader's death"
        assert "killed by SIGKILL" in told[0] and "removed its temporary files" in told[0]
        assert list(group_members(pgid)) == [] and not tmp_dir.exists()
        assert "killed by SIGKILL" in exit_note(server.base_url)
        assert not server.running and server.stop() == -signal.SIGKILL
    finally:
        server.stop()


def test_stop_removes_the_temp_folder(tmp_path):
    py = executable(tmp_path / "python", FORKING_STANDIN.format(python=sys.executable))
    cfg = VLLMConfig(model=str(tiny_model_folder(tmp_path)), python=str(py), ready_timeout_s=30)
    with VLLMServer(cfg) as server:
        tmp_dir, pgid = server.tmp_dir, server.process.pid
        assert tmp_dir.is_dir()
    assert not tmp_dir.exists() and list(group_members(pgid)) == []


@pytest.mark.slow
@pytest.mark.vllm
def test_real_vllm_killed_under_serve_up_leaves_nothing_behind(tmp_path, student_base_dir):
    """`verdict serve up` with the real CPU vLLM; kill -9 of the vLLM leader: no process of its group
    survives, its temp folder is gone, stderr and /readyz say why, the API keeps answering."""
    import signal

    import httpx
    import yaml
    from verdict.serve.students import STUDENT_MAX_TOKENS, student_vllm_config

    need(vllm_available(), f"vLLM environment missing ({vllm_python()})")
    adapters = {name: random_adapter(student_base_dir, tmp_path / name) for name in ("parser", "value_miner")}
    vllm = student_vllm_config(student_base_dir, adapters, tmp_path / "vllm.log").model_dump()
    cfg = tmp_path / "up.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "vllm": vllm,
                "api": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "formalizer": {"max_tokens": STUDENT_MAX_TOKENS, "health_check_interval_s": 1},
                    "audit_db": str(tmp_path / "audit.sqlite"),
                    "api_keys": str(tmp_path / "keys.json"),
                    "log_file": str(tmp_path / "api.log"),
                },
            }
        )
    )
    ready = tmp_path / "ready.json"
    out, err = open(tmp_path / "stdout.txt", "w"), open(tmp_path / "stderr.txt", "w")
    exe = Path(sys.executable).with_name("verdict")
    proc = subprocess.Popen(
        [str(exe), "serve", "up", "--config", str(cfg), "--init", "--ready-file", str(ready)],
        stdout=out,
        stderr=err,
        cwd=REPO,
    )
    out.close(), err.close()
    try:
        deadline = time.monotonic() + 400
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.5)
        url = json.loads(ready.read_text())["url"]
        state = json.loads((tmp_path / "stdout.txt").read_text().splitlines()[0])
        pgid, tmp_dir = state["pid"], Path(state["tmp_dir"])
        assert tmp_dir.is_dir() and len(list(group_members(pgid))) >= 2  # the API server and its engine core
        assert httpx.get(url + "/readyz", timeout=10).status_code == 200
        os.kill(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        # the supervisor says so on stderr, then in the API's log: wait for both, not for the first
        while not all("killed by SIGKILL" in (tmp_path / f).read_text() for f in ("stderr.txt", "api.log")):
            assert time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()[-3000:]
            time.sleep(0.2)
        assert list(group_members(pgid)) == [] and not tmp_dir.exists()
        r = httpx.get(url + "/readyz", timeout=10)
        assert r.status_code == 503 and "killed by SIGKILL" in r.json()["reason"], r.text
        assert r.json()["endpoints"][0]["state"] == "down"
        assert proc.poll() is None  # the API itself stays up (503 + Retry-After, not a crash)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()


# ---- a launcher killed by SIGKILL takes its server (and the server's children) with it ---------------
LAUNCHER = """
import json, sys
from pathlib import Path
from verdict.serve.vllm.config import VLLMConfig
from verdict.serve.vllm.server import VLLMServer
from verdict.train.run_dir import write_atomic
model, python, out = sys.argv[1:]
server = VLLMServer(VLLMConfig(model=model, python=python, ready_timeout_s=30)).start()
# whole or not at all: the test reads it as soon as it exists
write_atomic(Path(out), json.dumps({"leader": server.pid, "tmp_dir": str(server.tmp_dir)}))
import time
while True:
    time.sleep(1)
"""


def alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaping parent counts as gone)."""
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except OSError:
        return False


def test_server_and_its_children_die_with_a_sigkilled_launcher(tmp_path):
    """kill -9 of the process that started the server (as of `verdict serve up`): the server, the engine
    process it spawned and its temp folder go too (they stayed under init before)."""
    import signal

    py = executable(tmp_path / "python", FORKING_STANDIN.format(python=sys.executable))
    out = tmp_path / "launched.json"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tiny_model_folder(tmp_path)), str(py), str(out)], cwd=REPO
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not out.exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        info = json.loads(out.read_text())
        pids = [info["leader"], int((tmp_path / "child.pid").read_text())]
        tmp_dir = Path(info["tmp_dir"])
        assert all(alive(p) for p in pids) and tmp_dir.is_dir()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 30  # a bound on the wait, not a speed claim
        while (any(alive(p) for p in pids) or tmp_dir.exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if alive(p)] == [] and not tmp_dir.exists()
    finally:
        launcher.kill()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_temp_folder_left_by_a_dead_launcher_is_removed_at_the_next_start(tmp_path, monkeypatch):
    import tempfile

    from verdict.serve.vllm.server import TMP_PREFIX, remove_orphaned_tmp_dirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"{TMP_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{TMP_PREFIX}{os.getpid()}-def"
    for folder in (orphan, live):
        (folder / "engine").mkdir(parents=True)
    assert remove_orphaned_tmp_dirs() == [orphan]
    assert not orphan.exists() and live.is_dir()
