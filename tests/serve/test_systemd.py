"""systemd units (serve/systemd.py): rendered for a site's prefix, they pass `systemd-analyze verify`
and name no path of this repository."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.serve.conftest import verdict_command
from tests.support import REPO, need


def test_units_for_a_site_prefix_pass_systemd_analyze_verify(tmp_path):
    need(shutil.which("systemd-analyze") is not None, "systemd-analyze missing (apt-get install systemd)")
    prefix, state, site = tmp_path / "opt" / "verdict", tmp_path / "var" / "lib" / "verdict", tmp_path / "etc"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "verdict").symlink_to(verdict_command()[0])  # the site's install of the command
    state.mkdir(parents=True)
    (site / "serve").mkdir(parents=True)
    (site / "serve" / "site.yaml").write_text(
        f"root: {state}\napi: {{formalizer: {{base_url: 'http://127.0.0.1:8011/v1'}}}}\n"
    )
    r = subprocess.run(
        [*verdict_command(), "--config-dir", str(site), "serve", "systemd", "--config", "site",
         "--prefix", str(prefix), "--state-dir", str(state), "--user", "root", "--group", "root",
         "--hashes", str(state / "deployed.sha256"),
         "--out", str(tmp_path / "units")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    units = sorted((tmp_path / "units").iterdir())
    assert [u.name for u in units] == ["verdict-api.service", "verdict-vllm.service"]
    api = units[0].read_text()
    assert f"ExecStart={prefix}/bin/verdict --config-dir {site} serve api --config site" in api
    assert "After=verdict-vllm.service" in api and f"ReadWritePaths={state}" in api and "UMask=0077" in api
    vllm = units[1].read_text()
    assert f"ExecStartPre=/usr/bin/sha256sum --check --quiet --strict {state / 'deployed.sha256'}" in vllm
    for u in units:
        assert str(REPO) not in u.read_text()
    v = subprocess.run(
        ["systemd-analyze", "verify", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    assert v.returncode == 0 and not v.stderr.strip(), v.stderr


def test_relative_paths_are_refused():
    cmd = ["serve", "systemd", "--config", "site", "--prefix", "opt/verdict", "--state-dir", "/x"]
    r = subprocess.run([*verdict_command(), *cmd], capture_output=True, text=True, timeout=120)
    assert (
        r.returncode == 2
        and "'opt/verdict' must be an absolute path" in r.stderr
        and "Traceback" not in r.stderr
    )


@pytest.mark.parametrize("folder", ["configs", "docs"])
def test_no_absolute_path_of_this_repository_is_shipped(folder):
    for f in (REPO / folder).rglob("*"):
        if f.is_file() and f.suffix in (".yaml", ".md", ".service"):
            assert str(REPO) not in f.read_text(), f
