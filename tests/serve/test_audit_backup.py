"""Backups of a SQLite audit store (serve/audit/backup.py): taken while writer processes append, the
copy is private, restores, and verifies against the head the backup printed; a schema upgrade makes
a backup first."""

from __future__ import annotations

import subprocess
import sys
import time

from verdict.serve.audit import AuditStore

from tests.serve.conftest import verdict_command
from tests.serve.test_audit import make_schema_3_store
from tests.support import REPO

# A writer process: appends decisions until the stop file exists, then one more (so rows certainly
# land after the backup), and prints how many it wrote.
WRITER = """
import sys
from pathlib import Path
from verdict.serve.audit import AuditStore
from tests.serve.test_audit import add
store, stop, n = AuditStore(sys.argv[1]), Path(sys.argv[2]), 0
while not stop.exists():
    add(store, created_by=sys.argv[3]); n += 1
add(store, created_by=sys.argv[3]); store.close(); print(n + 1)
"""


def verdict(*args):
    return subprocess.run([*verdict_command(), *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_a_backup_taken_while_writers_run_restores_and_verifies(tmp_path):
    db, stop = tmp_path / "audit.sqlite", tmp_path / "stop"
    AuditStore(db).close()
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(db), str(stop), f"w{i}"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        reader = AuditStore(db, read_only=True)
        while reader.count("decisions") < 20:  # both writers under way before the backup starts
            assert all(w.poll() is None for w in writers)
            time.sleep(0.05)
        reader.close()
        r = verdict(
            "serve", "audit", "backup", "--db", str(db), "--out", str(tmp_path / "b" / "backup.sqlite")
        )
        assert all(w.poll() is None for w in writers)  # they wrote on through the backup
    finally:
        stop.touch()
        written = sum(int(w.communicate(timeout=120)[0]) for w in writers)
    assert r.returncode == 0, r.stderr
    head = r.stdout.strip()
    copy = tmp_path / "b" / "backup.sqlite"
    assert copy.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "b" / "backup.sqlite-wal").exists()  # one self-contained file
    backed_up = int(head.split(":")[0])
    assert 20 <= backed_up < written  # a consistent prefix: rows were written after it
    # the live store still holds the backup's head in its chain
    assert verdict("serve", "audit", "verify", "--db", str(db), "--head", head).returncode == 0
    # restore: checked against the recorded head before and after the copy
    restored = tmp_path / "restored" / "audit.sqlite"
    r = verdict("serve", "audit", "restore", "--from", str(copy), "--to", str(restored), "--head", head)
    assert r.returncode == 0, r.stderr
    assert restored.stat().st_mode & 0o777 == 0o600
    r = verdict("serve", "audit", "verify", "--db", str(restored), "--head", head)
    assert r.returncode == 0 and r.stdout.strip() == head, r.stderr
    # a wrong recorded head is refused, and nothing is overwritten
    wrong = f"{backed_up}:{'0' * 64}"
    r = verdict(
        "serve", "audit", "restore", "--from", str(copy), "--to", str(tmp_path / "x.sqlite"), "--head", wrong
    )
    assert (
        r.returncode == 2
        and "does not match the recorded head" in r.stderr
        and not (tmp_path / "x.sqlite").exists()
    )
    r = verdict("serve", "audit", "backup", "--db", str(db), "--out", str(copy))
    assert r.returncode == 2 and "exists" in r.stderr


def test_a_schema_upgrade_makes_a_backup_first(tmp_path):
    path = tmp_path / "v3.sqlite"
    head = make_schema_3_store(path)
    AuditStore(path).close()  # a writer upgrades it in place
    (backup,) = tmp_path.glob("v3.sqlite.schema-3-backup-*.sqlite")
    assert backup.stat().st_mode & 0o777 == 0o600
    ro = AuditStore(backup, read_only=True)
    report = ro.verify()
    ro.close()
    assert report.ok and report.head == (2, head) and report.rows["screenings"] == 0
    AuditStore(path).close()  # an upgraded store is not backed up again
    assert len(list(tmp_path.glob("v3.sqlite.schema-*"))) == 1


def test_the_quote_hash_key_goes_with_a_backup_of_a_configured_store(tmp_path):
    """With --config the quote-hash secret is copied beside the backup, 0600 (without it, keyed hashes
    of rows written after a restore cannot be compared with the old ones); with --db a note says so."""
    import yaml

    db, keys, key = tmp_path / "audit.sqlite", tmp_path / "keys.json", tmp_path / "audit_hash.key"
    AuditStore(db).close()
    key.write_bytes(b"k" * 32)
    key.chmod(0o600)
    cfg = {
        "api": {
            "formalizer": {"base_url": "http://127.0.0.1:9/v1"},
            "audit_db": str(db),
            "api_keys": str(keys),
        }
    }
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "b" / "backup.sqlite"
    out.parent.mkdir()
    r = verdict("serve", "audit", "backup", "--config", str(tmp_path / "serve.yaml"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    copy = out.with_name("backup.sqlite.hash.key")
    assert copy.read_bytes() == key.read_bytes() and copy.stat().st_mode & 0o777 == 0o600
    r = verdict("serve", "audit", "backup", "--db", str(db), "--out", str(tmp_path / "b" / "two.sqlite"))
    assert r.returncode == 0 and "quote-hash key (api.audit_hash_key) is not in this backup" in r.stderr
