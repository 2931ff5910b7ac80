"""Content-addressed call cache and ledger in one SQLite file, shared by runs.

Key: sha256 of the canonical request (endpoint, model, prompt template identity, parameters,
structured-output schema, messages), so any change of prompt wording, parameter or input is a new
key and an identical request is never paid for twice.

Crash safety: WAL journal; a response is written, with its ledger entry, in one transaction right
after it arrives, so `kill -9` at any moment either keeps the whole call or none of it. That
transaction is also synced to disk (synchronous=FULL) so that an answered call survives a power
loss too; bookkeeping writes (journal, cache-hit rows) skip the sync (they survive a killed
process, which is what they are for). A call is journaled in `inflight` before it is sent and
cleared in that same transaction: a row left there after a crash is a call whose answer never
arrived (the only call a resumed run may send again), and `verdict teacher stats` reports it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
  key TEXT PRIMARY KEY,
  endpoint TEXT NOT NULL, model TEXT NOT NULL, teacher TEXT NOT NULL, stage TEXT NOT NULL,
  prompt TEXT NOT NULL,
  content TEXT, finish_reason TEXT,
  prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, usage_estimated INTEGER NOT NULL,
  cost_usd REAL NOT NULL, attempts INTEGER NOT NULL, latency_s REAL NOT NULL,
  run TEXT NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run TEXT NOT NULL, stage TEXT NOT NULL, teacher TEXT NOT NULL, key TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('paid', 'cache_hit')),
  prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
  at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_run ON ledger (run, kind);
CREATE TABLE IF NOT EXISTS inflight (
  key TEXT NOT NULL, run TEXT NOT NULL, stage TEXT NOT NULL, started REAL NOT NULL,
  PRIMARY KEY (key, run)
);
"""


def canonical_key(request: dict) -> str:
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CachedCall:
    key: str
    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    usage_estimated: bool = False
    attempts: int = 1
    latency_s: float = 0.0


@dataclass(frozen=True)
class CallMeta:
    """Who made a call: for the ledger and stats."""

    run: str
    stage: str
    teacher: str
    endpoint: str
    model: str
    prompt: str


def open_db(path: Path, schema: str | None = None) -> sqlite3.Connection:
    """An autocommit SQLite connection in WAL mode, shareable across threads (callers lock)."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    if schema is not None:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(schema)
    return db


class CallCache:
    """Thread-safe. Writes go through one connection, reads through another: in WAL mode a read
    never waits for a write (and its sync), so an event loop can read while a thread writes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = open_db(self.path, SCHEMA)
        self._lock = threading.RLock()
        self._rdb = open_db(self.path)
        self._rlock = threading.RLock()

    def close(self) -> None:
        with self._lock, self._rlock:
            self._rdb.close()
            self._db.close()

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._rlock:
            return self._rdb.execute(sql, args).fetchall()

    # -- calls -----------------------------------------------------------------------------------
    def get(self, key: str) -> CachedCall | None:
        rows = self._read(
            "SELECT key, content, finish_reason, prompt_tokens, completion_tokens, cost_usd, usage_estimated,"
            " attempts, latency_s FROM calls WHERE key = ?",
            (key,),
        )
        if not rows:
            return None
        row = rows[0]
        return CachedCall(row[0], row[1], row[2], row[3], row[4], row[5], bool(row[6]), row[7], row[8])

    def begin(self, key: str, meta: CallMeta) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO inflight VALUES (?, ?, ?, ?)",
                (key, meta.run, meta.stage, time.time()),
            )

    def abandon(self, key: str, meta: CallMeta) -> None:
        """The call failed without an answer (nothing to pay for): clear its journal entry."""
        with self._lock:
            self._db.execute("DELETE FROM inflight WHERE key = ? AND run = ?", (key, meta.run))

    def store(self, call: CachedCall, meta: CallMeta) -> None:
        """Record an answered call, its ledger entry and the end of its journal entry atomically."""
        now = time.time()
        with self._lock:
            db = self._db
            db.execute("PRAGMA synchronous=FULL")  # this commit is money: sync it
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute(
                    "INSERT OR IGNORE INTO calls VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        call.key,
                        meta.endpoint,
                        meta.model,
                        meta.teacher,
                        meta.stage,
                        meta.prompt,
                        call.content,
                        call.finish_reason,
                        call.prompt_tokens,
                        call.completion_tokens,
                        int(call.usage_estimated),
                        call.cost_usd,
                        call.attempts,
                        call.latency_s,
                        meta.run,
                        now,
                    ),
                )
                _add_ledger_entry(db, call, meta, "paid", call.cost_usd, now)
                db.execute("DELETE FROM inflight WHERE key = ? AND run = ?", (call.key, meta.run))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            finally:
                db.execute("PRAGMA synchronous=NORMAL")

    def record_hit(self, call: CachedCall, meta: CallMeta) -> None:
        with self._lock:
            _add_ledger_entry(self._db, call, meta, "cache_hit", 0.0, time.time())

    # -- queries ---------------------------------------------------------------------------------
    def spent(self, run: str) -> float:
        [(v,)] = self._read(
            "SELECT COALESCE(SUM(cost_usd), 0) FROM ledger WHERE run = ? AND kind = 'paid'", (run,)
        )
        return float(v)

    def inflight(self, run: str | None = None) -> list[tuple[str, str, str]]:
        """(key, run, stage) of calls sent but never answered (left by a crash)."""
        q = "SELECT key, run, stage FROM inflight" + (" WHERE run = ?" if run else "")
        return [tuple(r) for r in self._read(q, (run,) if run else ())]

    def clear_inflight(self, run: str) -> int:
        with self._lock:
            return self._db.execute("DELETE FROM inflight WHERE run = ?", (run,)).rowcount

    def ledger_summary(self, run: str) -> list[dict]:
        """Per (stage, teacher, kind): calls, tokens, cost."""
        rows = self._read(
            "SELECT stage, teacher, kind, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_usd)"
            " FROM ledger WHERE run = ? GROUP BY stage, teacher, kind ORDER BY stage, teacher, kind",
            (run,),
        )
        return [
            dict(
                stage=r[0],
                teacher=r[1],
                kind=r[2],
                calls=r[3],
                prompt_tokens=r[4] or 0,
                completion_tokens=r[5] or 0,
                cost_usd=r[6] or 0.0,
            )
            for r in rows
        ]

    def count_calls(self) -> int:
        return self._read("SELECT COUNT(*) FROM calls")[0][0]


def _add_ledger_entry(
    db: sqlite3.Connection, call: CachedCall, meta: CallMeta, kind: str, cost_usd: float, at: float
) -> None:
    """One ledger row: a paid call, or a cache hit (cost 0), charged to `meta`'s run and stage."""
    db.execute(
        "INSERT INTO ledger (run, stage, teacher, key, kind, prompt_tokens, completion_tokens, cost_usd, at) "
        "VALUES (?,?,?,?,?,?,?,?,?)",
        (meta.run, meta.stage, meta.teacher, call.key, kind, call.prompt_tokens, call.completion_tokens,
         cost_usd, at),
    )  # fmt: skip
