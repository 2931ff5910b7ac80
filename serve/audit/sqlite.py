"""The audit store in one SQLite file (the single-node default).

What the database enforces: triggers refuse UPDATE and DELETE on every table, and a BEFORE INSERT
trigger refuses a row whose key exists (so `INSERT OR REPLACE` cannot rewrite one: conflict clauses
are honoured despite UPDATE/DELETE triggers). Writes are serialized (`BEGIN IMMEDIATE`, also across
processes) and durable (`synchronous=FULL`). Whoever can write the file can still drop the triggers:
`verify` reports missing or altered triggers and any break in the hash chain.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import AuditUnavailable, ServeConfigError
from .backup import backup
from .chain import link
from .store import (
    COLUMNS,
    HEAD_SQL,
    SCHEMA_VERSION,
    UPGRADES_FROM,
    AuditStore,
    schema_version_of,
    tables_of,
    tampered,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    seq INTEGER PRIMARY KEY,      -- place in the one hash chain over trials and decisions
    trial_id TEXT NOT NULL,
    program_hash TEXT NOT NULL,
    source_key TEXT,              -- parse-cache key: hash of criteria text + parser model + prompt version
    origin TEXT NOT NULL,         -- 'parser' | 'upload' (see store.py: who may create which)
    parser_model TEXT,
    prompt_version TEXT,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL,     -- API key id
    program_json TEXT NOT NULL,
    details_json TEXT,            -- origin-specific facts (JSON), e.g. what a revision revises
    prev_hash TEXT NOT NULL,
    row_hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trials_by_id ON trials (trial_id, seq);
CREATE INDEX IF NOT EXISTS trials_by_source ON trials (source_key);
CREATE INDEX IF NOT EXISTS trials_by_hash ON trials (program_hash);
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY,
    decision_id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL,
    trial_id TEXT NOT NULL,
    program_hash TEXT NOT NULL,
    patient_id TEXT NOT NULL,
    note_hash TEXT NOT NULL,
    patient_hash TEXT NOT NULL,
    policy_name TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    engine_version TEXT NOT NULL,
    decision TEXT NOT NULL,
    models_json TEXT NOT NULL,    -- parser / value-miner adapters, base model, endpoint
    timings_json TEXT NOT NULL,
    artifacts_json TEXT NOT NULL, -- decision, resolved patient, miner outputs, rationale
    note_text TEXT,               -- NULL when store_notes is off
    prev_hash TEXT NOT NULL,
    row_hash TEXT NOT NULL,
    parent_id TEXT,               -- schema 3: the decision this one supersedes (review, rescreen)
    lineage_json TEXT             -- schema 3: kind and changes (who, when, why)
);
CREATE INDEX IF NOT EXISTS decisions_by_pair ON decisions (patient_id, trial_id);
CREATE UNIQUE INDEX IF NOT EXISTS decisions_by_parent ON decisions (parent_id);
CREATE TABLE IF NOT EXISTS screenings (  -- schema 4: one row per screening run
    seq INTEGER PRIMARY KEY,
    screening_id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL,     -- API key id
    direction TEXT NOT NULL,      -- 'patient' (one patient x trials) | 'trial' (one trial x patients)
    source_kind TEXT NOT NULL,    -- as the caller stated it: text | fhir_bundle | ... | api
    source_label TEXT,            -- e.g. the FHIR server's base URL, a file name (never patient text)
    policy_name TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    counts_json TEXT NOT NULL,    -- pairs, ranked per tier, failures
    decision_ids_json TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    row_hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS screenings_by_time ON screenings (created_at);
"""
# In-place upgrades, by the schema they reach; no existing row is rewritten. 3: columns added (NULL in
# every existing row); 4: the screenings table and its triggers, created by _SCHEMA (IF NOT EXISTS).
_UPGRADES = {
    3: [
        "ALTER TABLE decisions ADD COLUMN parent_id TEXT",
        "ALTER TABLE decisions ADD COLUMN lineage_json TEXT",
    ],
    4: [],
}
_KEYS = {"meta": "key = NEW.key", "trials": "seq = NEW.seq",
         "decisions": "seq = NEW.seq OR decision_id = NEW.decision_id"}  # fmt: skip


def _triggers(keys: dict[str, str]) -> dict[str, str]:
    return {
        **{
            f"{t}_no_{op.lower()}": f"CREATE TRIGGER IF NOT EXISTS {t}_no_{op.lower()} BEFORE {op} ON {t} "
            f"BEGIN SELECT RAISE(ABORT, 'audit store is append-only: {op} on {t} refused'); END"
            for t in keys
            for op in ("UPDATE", "DELETE")
        },
        **{
            f"{t}_no_replace": f"CREATE TRIGGER IF NOT EXISTS {t}_no_replace BEFORE INSERT ON {t} "
            f"WHEN EXISTS (SELECT 1 FROM {t} WHERE {key}) "
            f"BEGIN SELECT RAISE(ABORT, 'audit store is append-only: replacing a row of {t} refused'); END"
            for t, key in keys.items()
        },
    }


TRIGGERS = _triggers(_KEYS)  # the tables of schemas 2 and 3
TRIGGERS_4 = _triggers({"screenings": "seq = NEW.seq OR screening_id = NEW.screening_id"})  # schema 4 adds


def triggers_of(version: int | None) -> dict[str, str]:
    return {**TRIGGERS, **(TRIGGERS_4 if (version or 0) >= 4 else {})}


class SqliteAuditStore(AuditStore):
    """One connection, one lock (writes are small; WAL mode)."""

    backend = "sqlite"

    def __init__(self, location: str | os.PathLike, store_notes: bool = True, *, read_only: bool = False):
        self.path = Path(location)
        self.location = str(location)
        self.store_notes = store_notes
        self.read_only = read_only
        memory = self.location == ":memory:"
        if read_only and not self.path.exists():
            raise ServeConfigError(f"audit store {location} does not exist")
        if not read_only and not memory and not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Created private before the first byte of patient text can land in it.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            if read_only:
                uri = self.path.resolve().as_uri() + "?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
            else:
                self._db = sqlite3.connect(self.location, check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("PRAGMA busy_timeout=10000")
                self._create_schema()
            self._check_schema_version()
            self._columns = {
                t: tuple(c for c in names if c in {r[1] for r in self._db.execute(f"PRAGMA table_info({t})")})
                for t, names in COLUMNS.items()
            }
        except sqlite3.DatabaseError as e:
            raise ServeConfigError(f"audit store {location} is unusable: {e}") from None
        self._lock = threading.Lock()

    def _backup_before_upgrade(self) -> None:
        """A store of an older schema is copied (SQLite backup API, verified, 0600) before this
        writer upgrades it in place: `<store>.schema-<old>-backup-<UTC time>.sqlite`, logged."""
        has_chain = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'trials' AND sql LIKE '%row_hash%'"
        ).fetchone()
        version = self._version() if has_chain else None
        if version not in UPGRADES_FROM or self.location == ":memory:":
            return

        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dest = self.path.with_name(f"{self.path.name}.schema-{version}-backup-{stamp}.sqlite")
        report = backup(self.path, dest)
        logging.getLogger("verdict.serve").warning(
            "audit store %s: schema %s is upgraded to %s; backup first: %s (head %s)",
            self.path.absolute(),
            version,
            SCHEMA_VERSION,
            dest.absolute(),
            report.head_text,
        )

    def _create_schema(self) -> None:
        self._backup_before_upgrade()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            old = self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'trials' AND sql NOT LIKE '%row_hash%'"
            ).fetchone()
            existing = self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'trials'").fetchone()
            problems = self._protection_problems() if existing and old is None else []
            if problems:
                raise ServeConfigError(tampered(self.location, problems))
            version = self._version() if existing and old is None else None
            if version in UPGRADES_FROM:
                for to in range(version + 1, SCHEMA_VERSION + 1):
                    for stmt in _UPGRADES[to]:
                        self._db.execute(stmt)
                    self._db.execute("INSERT INTO meta VALUES (?, ?)", (f"schema_upgrade:{to}", str(to)))
            if old is None:  # one statement at a time: executescript would commit
                triggers = list(triggers_of(SCHEMA_VERSION).values())
                for stmt in [s for s in _SCHEMA.split(";") if s.strip()] + triggers:
                    self._db.execute(stmt)
                self._db.execute(
                    "INSERT INTO meta SELECT 'schema_version', ? "
                    "WHERE NOT EXISTS (SELECT 1 FROM meta WHERE key = 'schema_version')",
                    (str(SCHEMA_VERSION),),
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _version(self) -> int | None:
        return schema_version_of(self._db.execute("SELECT key, value FROM meta").fetchall())

    def _check_schema_version(self) -> None:
        version = self._version()
        self._tables = tables_of(version)
        # verify (read-only) also reads an older store as it is: it never changes evidence
        if version != SCHEMA_VERSION and not (self.read_only and version in UPGRADES_FROM):
            raise ServeConfigError(
                f"audit store {self.location} has schema version {version or 'none'}, this service "
                f"writes {SCHEMA_VERSION} (the hash chain): keep the old file as the record and point "
                "api.audit_db at a new one"
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _append(self, table: str, columns: dict[str, Any], refuse_if=None) -> dict[str, Any]:
        names = COLUMNS[table]
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")  # one writer at a time, across processes too
            except sqlite3.OperationalError as e:  # locked past busy_timeout, disk trouble
                raise AuditUnavailable(f"the audit store is unavailable: {e}") from None
            try:
                found = refuse_if and self._db.execute(refuse_if.sql, refuse_if.args).fetchone()
                if found:
                    raise refuse_if.error(tuple(found))
                head = self._db.execute(HEAD_SQL).fetchone()
                row = link(table, columns, tuple(head) if head else None)
                self._db.execute(
                    f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                    tuple(row[n] for n in names),
                )
                self._db.execute("COMMIT")
            except BaseException as e:
                self._db.execute("ROLLBACK")
                if isinstance(e, sqlite3.OperationalError):
                    raise AuditUnavailable(f"the audit store is unavailable: {e}") from None
                raise
        return row

    def _select(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    @contextmanager
    def _snapshot(self):
        with self._lock:
            self._db.execute("BEGIN")  # one read transaction: one snapshot of both tables
            try:
                yield
            finally:
                self._db.execute("COMMIT")

    def _stream(self, table: str) -> Iterator[dict[str, Any]]:
        names = self._columns[table]  # an older store read by verify has no lineage columns
        cur = self._db.cursor()  # its own cursor: verify reads both tables side by side
        cur.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY seq")
        for r in cur:
            yield dict(zip(names, r))

    def _protection_problems(self) -> list[str]:
        have = dict(self._db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall())
        problems = []
        for name, stmt in triggers_of(self._version()).items():
            if name not in have:
                problems.append(f"trigger {name} is missing (dropped)")
            elif have[name] != stmt.replace("IF NOT EXISTS ", ""):
                problems.append(f"trigger {name} was altered")
        return problems
