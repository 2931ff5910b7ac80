"""Backup and restore of a SQLite audit store while the service writes to it.

`cp audit.sqlite` of a running store copies a file whose newest rows are still in the WAL: a broken
or stale copy. `backup()` uses SQLite's online backup API in one step (one read snapshot; writers in
other processes go on meanwhile), writes a self-contained copy (rollback journal, no WAL) created
0600 before the first byte, verifies it (hash chain and triggers) and returns its head (SEQ:HASH):
record it elsewhere, and a restore is checked against it. PostgreSQL stores: `pg_dump`/`pg_restore`
(docs/deploy.md).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from ..errors import ServeConfigError
from .chain import ChainReport
from .store import AuditStore


class BackupError(ServeConfigError):
    """A backup or restore could not be made, or its copy does not verify."""


def _verify(path: Path, head: str | None = None) -> ChainReport:

    store = AuditStore(str(path), read_only=True)
    try:
        return store.verify(head)
    finally:
        store.close()


def _private_copy_target(dest: Path) -> None:
    if dest.exists():
        raise BackupError(f"{dest.absolute()} exists: choose a new file (a backup never overwrites)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def backup(source: str | Path, dest: str | Path) -> ChainReport:
    """A verified 0600 copy of the store at ``source`` in ``dest`` (a new file); its report (head)."""
    source, dest = Path(source), Path(dest)
    if not source.is_file():
        raise BackupError(f"audit store {source.absolute()} does not exist")
    _private_copy_target(dest)
    try:
        src = sqlite3.connect(source.resolve().as_uri() + "?mode=ro", uri=True)
        dst = sqlite3.connect(dest)
        try:
            src.execute("PRAGMA busy_timeout=10000")
            src.backup(dst)  # pages=-1: the whole store from one snapshot
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
        finally:
            dst.close()
            src.close()
        report = _verify(dest)
    except (sqlite3.Error, ServeConfigError) as e:
        dest.unlink(missing_ok=True)
        raise BackupError(f"backup of {source.absolute()} failed: {e}") from None
    if not report.ok:
        raise BackupError(f"the backup {dest.absolute()} does not verify", report.problems)
    return report


def restore(backup_file: str | Path, dest: str | Path, head: str) -> ChainReport:
    """Copy a backup to ``dest`` (a new file, 0600), after checking that it holds the recorded
    ``head`` (SEQ:HASH) and an intact chain; the restored file is verified again."""
    backup_file, dest = Path(backup_file), Path(dest)
    if not backup_file.is_file():
        raise BackupError(f"backup {backup_file.absolute()} does not exist")
    before = _verify(backup_file, head)
    if not before.ok:
        raise BackupError(
            f"backup {backup_file.absolute()} does not match the recorded head", before.problems
        )
    _private_copy_target(dest)
    with open(backup_file, "rb") as f, open(dest, "wb") as g:
        shutil.copyfileobj(f, g)
    after = _verify(dest, head)
    if not after.ok:
        raise BackupError(f"the restored store {dest.absolute()} does not verify", after.problems)
    return after
