"""A run's records: one row per stage item (accepted or rejected), in `<run dir>/records.sqlite`;
an item made of several calls (a trial parsed per criterion) also has one row per call.

A record is derived from cached calls, so one lost to a crash is rebuilt at no cost on resume;
each is written in one transaction, so none is ever half-written. The rows hold patient text
(prompts, evidence): the file stays on site like the notes themselves, and is never logged.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from verdict.data_gen.formalizer import StageResult, open_db

from .teacher_config import TASK_OF_STAGE

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
  record_id TEXT PRIMARY KEY,
  stage TEXT NOT NULL, task TEXT NOT NULL, trial_id TEXT NOT NULL, patient_id TEXT,
  status TEXT NOT NULL CHECK (status IN ('accepted', 'rejected')), reason TEXT, problems TEXT NOT NULL,
  teacher TEXT NOT NULL, model TEXT NOT NULL, prompt_version TEXT NOT NULL,
  messages TEXT NOT NULL, output_json TEXT, program_json TEXT,
  prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
  calls_paid INTEGER NOT NULL, cache_hits INTEGER NOT NULL, attempts INTEGER NOT NULL, repaired INTEGER NOT NULL,
  created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
"""  # noqa: E501 - the schema text is stored in sqlite_master: kept byte-identical


# The task of a result made of several calls (a trial's assembled program, a merged miner pass):
# its calls are the training examples (one row each, `<record id>#<item>`), it is not one itself.
ASSEMBLED = "assembled"


def record_id(stage: str, trial_id: str, patient_id: str | None = None) -> str:
    return f"{stage}:{trial_id}" + (f":{patient_id}" if patient_id else "")


def call_record_id(rid: str, item: str) -> str:
    """The record of one call of a multi-call result (a criterion, a miner chunk)."""
    return f"{rid}#{item}"


@dataclass(frozen=True)
class Record:
    record_id: str
    stage: str
    task: str
    trial_id: str
    patient_id: str | None
    status: str
    reason: str | None
    problems: list[str]
    teacher: str
    model: str
    prompt_version: str
    messages: list[dict[str, str]]
    output_json: str | None
    program_json: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    calls_paid: int
    cache_hits: int
    attempts: int
    repaired: bool


class RecordStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # derived data (rebuilt from the cache), so NORMAL sync: it survives a killed process
        self._db = open_db(self.path, SCHEMA)
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(
        self, result: StageResult, trial_id: str, patient_id: str | None = None, item: str | None = None
    ) -> str:
        """Record a stage result. ``item`` names the input when several share a trial id (the
        recorded teacher's variants a, b, ... of one trial); splits still group by ``trial_id``.
        A result made of several calls (`result.calls`: the parser's criteria, miner chunks) is
        one row of task `assembled` (the program, for resuming and mining) plus one row per call
        (`<record id>#<item>`, the stage's task): the calls are the SFT examples. All rows of a
        result are written in one transaction."""
        rid = record_id(result.stage, item or trial_id, patient_id)
        program_json = None
        if result.accepted and result.stage == "parser" and result.output is not None:
            program_json = result.output.model_dump_json(by_alias=True)
        task = ASSEMBLED if result.calls else TASK_OF_STAGE.get(result.stage, result.stage)
        rows = [_row(rid, result, task, trial_id, patient_id, program_json)]
        rows += [
            _row(
                call_record_id(rid, c.item or str(k)),
                c,
                TASK_OF_STAGE.get(c.stage, c.stage),
                trial_id,
                patient_id,
                None,
            )
            for k, c in enumerate(result.calls)
        ]
        with self._lock:
            self._db.execute("BEGIN")  # autocommit connection: one explicit transaction for all rows
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO records VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    rows,
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return rid

    def done_ids(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT record_id FROM records")}

    def records(self, status: str | None = None, task: str | None = None) -> list[Record]:
        q, args = "SELECT * FROM records WHERE 1=1", []
        if status:
            q, args = q + " AND status = ?", args + [status]
        if task:
            q, args = q + " AND task = ?", args + [task]
        with self._lock:
            rows = self._db.execute(q + " ORDER BY record_id", args).fetchall()
        return [_record(r) for r in rows]

    def programs(self) -> dict[str, str]:
        """trial_id -> accepted program JSON."""
        with self._lock:
            rows = self._db.execute(
                "SELECT trial_id, program_json FROM records WHERE stage = 'parser' "
                "AND status = 'accepted' AND program_json IS NOT NULL"
            ).fetchall()
        return {t: p for t, p in rows}

    def set_meta(self, key: str, value) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    def get_meta(self, key: str, default=None):
        with self._lock:
            row = self._db.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default


def _row(
    rid: str, result: StageResult, task: str, trial_id: str, patient_id: str | None, program_json: str | None
) -> tuple:
    u = result.usage
    return (
        rid,
        result.stage,
        task,
        trial_id,
        patient_id,
        result.status,
        result.reason,
        json.dumps(result.problems),
        result.teacher,
        result.model,
        result.prompt_version,
        json.dumps(result.messages, ensure_ascii=False),
        result.output_json,
        program_json,
        u.prompt_tokens,
        u.completion_tokens,
        u.cost_usd,
        u.calls_paid,
        u.cache_hits,
        len(result.attempts),
        int(result.repaired),
        time.time(),
    )


def _record(r) -> Record:
    return Record(
        record_id=r[0],
        stage=r[1],
        task=r[2],
        trial_id=r[3],
        patient_id=r[4],
        status=r[5],
        reason=r[6],
        problems=json.loads(r[7]),
        teacher=r[8],
        model=r[9],
        prompt_version=r[10],
        messages=json.loads(r[11]),
        output_json=r[12],
        program_json=r[13],
        prompt_tokens=r[14],
        completion_tokens=r[15],
        cost_usd=r[16],
        calls_paid=r[17],
        cache_hits=r[18],
        attempts=r[19],
        repaired=bool(r[20]),
    )
