"""Running the matching service for tests: a real `verdict serve api` process on a free port, with
its own config, key file, audit store and log, in front of a formalizer URL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fixtures.vllm import STUDENT_MAX_TOKENS
from tests.support import REPO

ROLES = {"match": ["match"], "audit": ["audit"], "admin": ["admin"]}
CHROMIUM = Path("/usr/bin/chromium")  # Debian's package, installed by .ci/run


CHROMEDRIVER = Path("/usr/bin/chromedriver")  # Debian's chromium-driver
# Nothing reaching outside the machine, whichever client drives the browser.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch_chromium(pw):
    """Headless Chromium through Playwright, with nothing reaching outside the machine."""
    return pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


def selenium_chromium(width: int = 1280, height: int = 900):
    """Headless Chromium through Selenium and Debian's chromedriver (no driver download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in [
        *CHROMIUM_ARGS,
        "--headless=new",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ]:
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


@dataclass
class RunningService:
    url: str
    folder: Path
    keys: dict[str, str]
    process: subprocess.Popen
    written: list[Path] = field(default_factory=list)  # every file the service wrote to (for scans)

    def client(self, role: str | None = "match", timeout: float = 300.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys[role]}"} if role else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout, trust_env=False)

    def upload(self, *programs: dict) -> None:
        """Upload reviewed trial programs (admin role); each must be accepted."""
        with self.client("admin") as c:
            for program in programs:
                r = c.post("/v1/trials", json={"program": program})
                assert r.status_code == 200, r.text

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode

    @property
    def log(self) -> str:
        return (self.folder / "service.log").read_text()


def write_service_config(folder: Path, formalizer_url: str, api: dict | None = None) -> Path:
    cfg = {
        "api": {
            "host": "127.0.0.1",
            "port": 0,
            "formalizer": {"base_url": formalizer_url, "max_tokens": STUDENT_MAX_TOKENS, "timeout_s": 120},
            "audit_db": str(folder / "audit.sqlite"),
            "api_keys": str(folder / "keys.json"),
            "log_file": str(folder / "service.log"),
        }
    }
    for k, v in (api or {}).items():
        if isinstance(v, dict) and isinstance(cfg["api"].get(k), dict):
            cfg["api"][k] = {**cfg["api"][k], **v}
        else:
            cfg["api"][k] = v
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def verdict_command() -> list[str]:
    exe = Path(sys.executable).with_name("verdict")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "verdict"]


def start_service(
    folder: Path, formalizer_url: str, api: dict | None = None, wait: bool = True
) -> RunningService:
    from verdict.serve.api_keys import KeyStore

    folder.mkdir(parents=True, exist_ok=True)
    store = KeyStore(folder / "keys.json")
    keys = {role: store.add(f"test-{role}", roles)[0] for role, roles in ROLES.items()}
    cfg = write_service_config(folder, formalizer_url, api)
    ready = folder / "ready.json"
    out, err = open(folder / "stdout.txt", "w"), open(folder / "stderr.txt", "w")
    env = {k: v for k, v in os.environ.items() if k != "VERDICT_EGRESS_ALLOW"}
    proc = subprocess.Popen(
        [*verdict_command(), "serve", "api", "--config", str(cfg), "--init", "--ready-file", str(ready)],
        stdout=out,
        stderr=err,
        cwd=REPO,
        env=env,
    )
    out.close()
    err.close()
    svc = RunningService(
        url="",
        folder=folder,
        keys=keys,
        process=proc,
        written=[folder / "service.log", folder / "stdout.txt", folder / "stderr.txt"],
    )
    if not wait:
        return svc
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            svc.stop()
            raise RuntimeError(
                f"service did not start (rc {proc.returncode}):\n"
                + (folder / "stderr.txt").read_text()[-3000:]
            )
        time.sleep(0.05)
    svc.url = json.loads(ready.read_text())["url"]
    return svc


@pytest.fixture(scope="module")
def scripted(request):
    """The scripted formalizer (real HTTP) answering the test module's `SCRIPT`."""
    from verdict.data_gen.scripted_server import Script, ScriptedServer

    srv = ScriptedServer(Script.model_validate(request.module.SCRIPT)).start()
    yield srv
    srv.stop()
