"""The matching API at start: the configured store and keys whatever the working directory, every
file it uses printed by absolute path, and no new empty store or key file unless `--init`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import yaml

from tests.serve.conftest import verdict_command


def start_api(cfg, cwd, *extra, wait=True):
    ready = cfg.parent / "ready.json"
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [*verdict_command(), "serve", "api", "--config", str(cfg), "--ready-file", str(ready), *extra],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return ready.exists(), proc.returncode, err


def test_started_from_another_directory_the_api_uses_the_configured_store(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    cfg = site / "serve.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "api": {
                    "port": 0,
                    "formalizer": {"base_url": "http://127.0.0.1:9/v1"},
                    "audit_db": "state/audit.sqlite",
                    "api_keys": "state/keys.json",
                    "log_file": "state/api.log",
                }
            }
        )
    )
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    # a first start without --init refuses, naming both files by absolute path, and creates nothing
    ready, rc, err = start_api(cfg, first)
    assert not ready and rc == 2 and "Traceback" not in err
    assert f"audit store {site / 'state' / 'audit.sqlite'} does not exist" in err
    assert f"API key file {site / 'state' / 'keys.json'} does not exist" in err and "--init" in err
    assert not (site / "state").exists()
    ready, rc, err = start_api(cfg, first, "--init")
    assert ready and rc == 0, err
    for line in (
        f"audit store: {site / 'state' / 'audit.sqlite'}",
        f"API keys: {site / 'state' / 'keys.json'}",
        f"log: {site / 'state' / 'api.log'}",
        f"serve config: {cfg}",
    ):
        assert line in err
    assert json.loads((site / "state" / "keys.json").read_text())["keys"] == []
    assert (site / "state" / "keys.json").stat().st_mode & 0o777 == 0o600
    # started again from another directory: the same files, nothing created where it runs
    ready, rc, err = start_api(cfg, second)
    assert ready and rc == 0, err
    assert list(first.iterdir()) == [] and list(second.iterdir()) == []


def test_keys_list_shows_each_keys_expiry(tmp_path):
    keys = tmp_path / "keys.json"
    add = [*verdict_command(), "serve", "keys", "add", "--keys-file", str(keys), "--role", "match"]
    subprocess.run([*add, "--name", "rotating", "--expires-days", "90"], check=True, capture_output=True)
    subprocess.run([*add, "--name", "forever"], check=True, capture_output=True)
    out = subprocess.run(
        [*verdict_command(), "serve", "keys", "list", "--keys-file", str(keys)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    expiry = {line.split("\t")[-1]: line.split("\t")[3] for line in out}
    assert expiry["forever"] == "expires never"
    assert re.fullmatch(r"expires \d{4}-\d\d-\d\dT\d\d:\d\dZ", expiry["rotating"])
