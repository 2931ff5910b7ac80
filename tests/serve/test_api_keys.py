"""API keys: printed once, stored as hashes, roles, revocation seen by a running store."""

from __future__ import annotations

import json
import stat

import pytest
from verdict.serve.api_keys import KeyStore
from verdict.serve.errors import ServeConfigError


def test_keys_are_stored_hashed_with_roles(tmp_path):
    path = tmp_path / "keys.json"
    store = KeyStore(path)
    key, entry = store.add("coordinator", ["match"])
    admin, _ = store.add("ops", ["admin"])
    text = path.read_text()
    assert key not in text and key.split("_", 2)[2] not in text  # neither the key nor its secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(text)["keys"][0]["roles"] == ["match"]
    got = store.authenticate(key)
    assert got.id == entry.id and got.allows("match") and not got.allows("audit")
    assert store.authenticate(admin).allows("audit")  # admin holds every role
    for bad in (
        None,
        "",
        "vk_",
        key[:-1] + ("A" if key[-1] != "A" else "B"),
        "Bearer " + key,
        f"vk_{entry.id}",
    ):
        assert store.authenticate(bad) is None


def test_revocation_reaches_a_store_that_is_already_serving(tmp_path):
    path = tmp_path / "keys.json"
    serving = KeyStore(path)
    key, entry = KeyStore(path).add("ehr", ["match", "audit"])
    assert serving.authenticate(key) is not None
    KeyStore(path).revoke(entry.id)  # another process (the CLI) edits the file
    assert serving.authenticate(key) is None
    with pytest.raises(ServeConfigError, match="no API key with id"):
        serving.revoke("nothere1")


def test_bad_roles_and_bad_files(tmp_path):
    with pytest.raises(ServeConfigError, match="unknown role"):
        KeyStore(tmp_path / "k.json").add("x", ["root"])
    p = tmp_path / "broken.json"
    p.write_text('{"keys": [{"id": "x"}]}')
    with pytest.raises(ServeConfigError, match="is invalid"):
        KeyStore(p).load()


def test_cli_add_list_revoke(tmp_path):
    import subprocess

    from tests.serve.conftest import verdict_command
    from tests.support import REPO

    keys = tmp_path / "keys.json"

    def run(*a):
        cmd = [*verdict_command(), "serve", "keys", *a, "--keys-file", str(keys)]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)

    r = run("add", "--name", "ehr", "--role", "match", "--role", "audit")
    assert r.returncode == 0 and r.stdout.startswith("vk_") and "roles match, audit" in r.stderr
    key = r.stdout.strip()
    listed = run("list")
    key_id = key.split("_")[1]
    assert f"{key_id}\tactive\tmatch,audit\texpires never\tehr" in listed.stdout and key not in listed.stdout
    assert run("revoke", key_id).returncode == 0
    assert f"{key_id}\trevoked" in run("list").stdout
    bad = run("add", "--name", "x", "--role", "root")
    assert bad.returncode == 2 and "error: unknown role" in bad.stderr


def test_keys_add_help_lists_every_role():
    """Issue 22.13: `keys add --help` listed three of the five roles."""
    from typer.testing import CliRunner
    from verdict.serve.api_keys import ROLES
    from verdict.serve.cli import keys_app

    r = CliRunner().invoke(keys_app, ["add", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert r.exit_code == 0 and " | ".join(ROLES) in r.output, r.output
    assert set(ROLES) == {"match", "audit", "review", "trial_owner", "admin"}
