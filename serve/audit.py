"""The append-only audit store (SQLite): every trial program the service used and every decision it
made, with what an auditor needs to reproduce it (input hashes, program version, model and adapter
ids, policy version, timings, artifacts).

Append-only is enforced by the database itself (triggers abort any UPDATE or DELETE), not by
convention. This store is the one place the service keeps patient text (the note, so that the
clinician page can show evidence in context; `store_notes: false` keeps only its hash): it is the
clinical record, readable only with the audit role, created with file mode 0600.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ServeConfigError

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    trial_id TEXT NOT NULL,
    program_hash TEXT NOT NULL,
    source_key TEXT,              -- parse-cache key: hash of criteria text + parser model + prompt version
    origin TEXT NOT NULL,         -- 'parser' | 'upload'
    parser_model TEXT,
    prompt_version TEXT,
    created_at REAL NOT NULL,
    created_by TEXT NOT NULL,     -- API key id
    program_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS trials_by_id ON trials (trial_id, seq);
CREATE INDEX IF NOT EXISTS trials_by_source ON trials (source_key);
CREATE INDEX IF NOT EXISTS trials_by_hash ON trials (program_hash);
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY,
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
    note_text TEXT                -- NULL when store_notes is off
);
CREATE INDEX IF NOT EXISTS decisions_by_pair ON decisions (patient_id, trial_id);
"""
_APPEND_ONLY = [
    f"CREATE TRIGGER IF NOT EXISTS {t}_no_{op.lower()} BEFORE {op} ON {t} "
    f"BEGIN SELECT RAISE(ABORT, 'audit store is append-only: {op} on {t} refused'); END;"
    for t in ("trials", "decisions")
    for op in ("UPDATE", "DELETE")
]


@dataclass(frozen=True)
class TrialRow:
    seq: int
    trial_id: str
    program_hash: str
    origin: str
    parser_model: str | None
    prompt_version: str | None
    created_at: float
    program_json: str


@dataclass(frozen=True)
class DecisionRow:
    decision_id: str
    created_at: float
    created_by: str
    trial_id: str
    program_hash: str
    patient_id: str
    note_hash: str
    patient_hash: str
    policy_name: str
    policy_version: str
    engine_version: str
    decision: str
    models: dict[str, Any]
    timings: dict[str, float]
    artifacts: dict[str, Any]
    note_text: str | None


_TRIAL_COLUMNS = (
    "SELECT seq, trial_id, program_hash, origin, parser_model, prompt_version, created_at, program_json "
    "FROM trials "
)


class AuditStore:
    """Thread-safe: one connection, one lock (writes are small; SQLite in WAL mode)."""

    def __init__(self, path: str | os.PathLike, store_notes: bool = True):
        self.path = Path(path)
        self.store_notes = store_notes
        fresh = str(path) != ":memory:" and not self.path.exists()
        if fresh:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Created private before the first byte of patient text can land in it.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA + "\n".join(_APPEND_ONLY))
            self._db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
        except sqlite3.DatabaseError as e:
            raise ServeConfigError(f"audit store {path} is unusable: {e}") from None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- trials ----------------------------------------------------------------------------------
    def add_trial(
        self,
        *,
        trial_id: str,
        program_hash: str,
        program_json: str,
        origin: str,
        created_by: str,
        source_key: str | None = None,
        parser_model: str | None = None,
        prompt_version: str | None = None,
    ) -> TrialRow:
        now = time.time()
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO trials (trial_id, program_hash, source_key, origin, parser_model,"
                " prompt_version, "
                "created_at, created_by, program_json) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    trial_id,
                    program_hash,
                    source_key,
                    origin,
                    parser_model,
                    prompt_version,
                    now,
                    created_by,
                    program_json,
                ),
            )
            seq = cur.lastrowid
        return TrialRow(seq, trial_id, program_hash, origin, parser_model, prompt_version, now, program_json)

    def trial_by_source(self, source_key: str) -> TrialRow | None:
        return self._one_trial("WHERE source_key = ? ORDER BY seq DESC LIMIT 1", (source_key,))

    def latest_trial(self, trial_id: str) -> TrialRow | None:
        """The newest version of a trial: an uploaded (reviewed) program supersedes parser output."""
        return self._one_trial("WHERE trial_id = ? ORDER BY seq DESC LIMIT 1", (trial_id,))

    def trial_version(self, trial_id: str, program_hash: str) -> TrialRow | None:
        return self._one_trial(
            "WHERE trial_id = ? AND program_hash = ? ORDER BY seq DESC LIMIT 1", (trial_id, program_hash)
        )

    def trial_versions(self, trial_id: str) -> list[TrialRow]:
        with self._lock:
            rows = self._db.execute(
                _TRIAL_COLUMNS + "WHERE trial_id = ? ORDER BY seq",
                (trial_id,),
            ).fetchall()
        return [TrialRow(*r) for r in rows]

    def _one_trial(self, where: str, args: tuple) -> TrialRow | None:
        with self._lock:
            row = self._db.execute(
                _TRIAL_COLUMNS + where,
                args,
            ).fetchone()
        return TrialRow(*row) if row else None

    # -- decisions -------------------------------------------------------------------------------
    def add_decision(
        self,
        *,
        created_by: str,
        trial_id: str,
        program_hash: str,
        patient_id: str,
        note_hash: str,
        patient_hash: str,
        policy_name: str,
        policy_version: str,
        engine_version: str,
        decision: str,
        models: dict,
        timings: dict,
        artifacts: dict,
        note_text: str | None,
    ) -> DecisionRow:
        row = DecisionRow(
            decision_id="dec_" + uuid.uuid4().hex,
            created_at=time.time(),
            created_by=created_by,
            trial_id=trial_id,
            program_hash=program_hash,
            patient_id=patient_id,
            note_hash=note_hash,
            patient_hash=patient_hash,
            policy_name=policy_name,
            policy_version=policy_version,
            engine_version=engine_version,
            decision=decision,
            models=models,
            timings=timings,
            artifacts=artifacts,
            note_text=note_text if self.store_notes else None,
        )
        with self._lock:
            self._db.execute(
                "INSERT INTO decisions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    row.decision_id,
                    row.created_at,
                    row.created_by,
                    row.trial_id,
                    row.program_hash,
                    row.patient_id,
                    row.note_hash,
                    row.patient_hash,
                    row.policy_name,
                    row.policy_version,
                    row.engine_version,
                    row.decision,
                    _dump(models),
                    _dump(timings),
                    _dump(artifacts),
                    row.note_text,
                ),
            )
        return row

    def decision(self, decision_id: str) -> DecisionRow | None:
        with self._lock:
            r = self._db.execute("SELECT * FROM decisions WHERE decision_id = ?", (decision_id,)).fetchone()
        if r is None:
            return None
        return DecisionRow(*r[:12], json.loads(r[12]), json.loads(r[13]), json.loads(r[14]), r[15])

    def count(self, table: str) -> int:
        assert table in ("trials", "decisions")
        with self._lock:
            return self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _dump(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
