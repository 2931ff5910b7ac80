"""The audit store's one interface; the backends (`sqlite.py`, `postgres.py`) only move rows.

    store = AuditStore("runs/serve/audit.sqlite")       # or "postgresql://verdict@db.site/verdict"

Trial versions are explicit. Each version has an origin, and the origin says who may create it and
whether it is reviewed:

    origin     created by           reviewed
    parser     match role           no       (the trial parser's output for criteria text)
    upload     admin role           yes      (a program a person reviewed, POST /v1/trials {program})
    revision   trial_owner or admin yes      (a corrected program, POST /v1/trials/{id}/revisions;
                                              details name the version it revises and why)

The *active* version of a trial, the one a match on its id uses, is the newest reviewed version, or
the newest parser version when there is none. So a parser run never supersedes a reviewed program:
it is stored (the parse cache and the audit keep it) but is not active. An explicit `program_hash`
still selects any stored version.

Decisions have a lineage (schema 3): a review or a re-screening appends a new decision whose
`parent_id` is the decision it supersedes and whose `lineage_json` records the changes (who, when,
why). A decision has at most one successor (refused in the append's transaction and by a unique
index), so a lineage is a chain and the newest decision of it is its *current* one. A schema-2
store is upgraded in place when a writer opens it: two nullable columns and an index are added,
rows are never rewritten, and the chain still verifies (a NULL new column is not hashed, chain.py).

Screening runs (schema 4): each `POST /v1/screen` appends one `screenings` row after its pairs' decisions:
who ran it, the direction, the source as the caller stated it (a kind and a short label such as a
FHIR server's base URL or a file name, never patient text), the counts, the decision ids and the
policy. A schema-2 or schema-3 store gets the new table (and its triggers) in place; no row changes.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ServiceError
from .chain import TABLES, ChainReport, check_chain, merge_by_seq

SCHEMA_VERSION = 4
# stores of these schemas are upgraded in place by a writer: 3 added the lineage columns, 4 the screenings
UPGRADES_FROM = (2, 3)
# origin -> the role that may create it (admin may create any)
ORIGIN_ROLE = {"parser": "match", "upload": "admin", "revision": "trial_owner"}
REVIEWED_ORIGINS = ("upload", "revision")
TRIAL_COLUMNS = (
    "seq", "trial_id", "program_hash", "source_key", "origin", "parser_model", "prompt_version",
    "created_at", "created_by", "program_json", "details_json", "prev_hash", "row_hash",
)  # fmt: skip
DECISION_COLUMNS = (
    "seq", "decision_id", "created_at", "created_by", "trial_id", "program_hash", "patient_id",
    "note_hash", "patient_hash", "policy_name", "policy_version", "engine_version", "decision",
    "models_json", "timings_json", "artifacts_json", "note_text", "parent_id", "lineage_json",
    "prev_hash", "row_hash",
)  # fmt: skip
LINEAGE_COLUMNS = ("parent_id", "lineage_json")  # added in schema 3 (nullable: a first decision has none)
SCREENING_COLUMNS = (
    "seq", "screening_id", "created_at", "created_by", "direction", "source_kind", "source_label",
    "policy_name", "policy_version", "counts_json", "decision_ids_json", "prev_hash", "row_hash",
)  # fmt: skip
COLUMNS = {"trials": TRIAL_COLUMNS, "decisions": DECISION_COLUMNS, "screenings": SCREENING_COLUMNS}
SCREENING_DIRECTIONS = ("patient", "trial")
_REVIEWED_SQL = ", ".join(f"'{o}'" for o in REVIEWED_ORIGINS)
ACTIVE_ORDER = f"ORDER BY CASE WHEN origin IN ({_REVIEWED_SQL}) THEN 1 ELSE 0 END DESC, seq DESC LIMIT 1"


class Superseded(ServiceError):
    """The decision was superseded by a newer one (409): act on the current decision."""

    status, code = 409, "superseded"


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
    created_by: str = ""
    details: dict[str, Any] | None = None  # origin-specific facts, e.g. what a revision revises and why

    @property
    def reviewed(self) -> bool:
        return self.origin in REVIEWED_ORIGINS


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
    parent_id: str | None = None  # the decision this one supersedes (a review or a re-screening)
    lineage: dict[str, Any] | None = None  # kind, changes (who, when, why); see serve/reviews/protocol.py


@dataclass(frozen=True)
class ScreeningRow:
    """One screening run: its source as the caller stated it, its counts and the decisions it made."""

    screening_id: str
    created_at: float
    created_by: str
    direction: str
    source_kind: str
    source_label: str | None
    policy_name: str
    policy_version: str
    counts: dict[str, Any]  # pairs, ranked (per tier), failures
    decision_ids: list[str]  # the ranked rows' decisions, best first


_TRIAL_SELECT = (
    "SELECT seq, trial_id, program_hash, origin, parser_model, prompt_version, created_at, program_json, "
    "created_by, details_json FROM trials "
)
_DECISION_SELECT = "SELECT " + ", ".join(DECISION_COLUMNS[1:19]) + " FROM decisions "
_SCREENING_SELECT = "SELECT " + ", ".join(SCREENING_COLUMNS[1:11]) + " FROM screenings "
_CURRENT = "NOT EXISTS (SELECT 1 FROM decisions c WHERE c.parent_id = decisions.decision_id)"


def is_postgres_url(location: str) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


def tables_of(version: int | None) -> tuple[str, ...]:
    """The chained tables a store of this schema has (verify reads an older store as it is)."""
    return TABLES if (version or 0) >= 4 else TABLES[:2]


# backend name -> its store class; each backend registers itself when its module is imported
BACKENDS: dict[str, type[AuditStore]] = {}


class AuditStore:
    """Append-only, enforced by the database; one hash chain over all rows. Thread-safe.

    `AuditStore(location)` opens the backend the location names: a file path (SQLite) or a
    postgresql:// URL (PostgreSQL; the password from `password_env` or libpq's PGPASSWORD).
    `read_only=True` opens an existing store without creating or repairing anything (for verify)."""

    backend = ""
    _tables: tuple[str, ...] = TABLES  # the chained tables this store has (set from its schema)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        BACKENDS[cls.backend] = cls  # sqlite.py, postgres.py: imported by the package (__init__.py)

    def __new__(cls, location, store_notes: bool = True, **kwargs):
        if cls is AuditStore:
            cls = BACKENDS["postgresql" if is_postgres_url(str(location)) else "sqlite"]
        return super().__new__(cls)

    # -- what a backend provides ----------------------------------------------------------------
    def _append(self, table: str, columns: dict[str, Any], refuse_if: Guard | None = None) -> dict[str, Any]:
        """Link `columns` after the newest row (serialized across writers) and insert it. `refuse_if`:
        a query run in the same transaction; if it returns a row, nothing is written and its error
        is raised (what must not have happened meanwhile, e.g. a decision already superseded)."""
        raise NotImplementedError

    def _select(self, sql: str, args: tuple = ()) -> list[tuple]:
        """Rows of a query written with `?` placeholders."""
        raise NotImplementedError

    def _stream(self, table: str) -> Iterator[dict[str, Any]]:
        """Every row of a table in seq order, as column -> value."""
        raise NotImplementedError

    def _protection_problems(self) -> list[str]:
        """What of the database's own append-only enforcement is missing (triggers)."""
        raise NotImplementedError

    def _snapshot(self):
        """A context in which `_stream` and `_protection_problems` see one consistent state."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

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
        details: dict[str, Any] | None = None,
        refuse_if: Guard | None = None,
    ) -> TrialRow:
        if origin not in ORIGIN_ROLE:
            raise ValueError(f"unknown trial origin '{origin}'")
        row = self._append(
            "trials",
            {
                "trial_id": trial_id,
                "program_hash": program_hash,
                "source_key": source_key,
                "origin": origin,
                "parser_model": parser_model,
                "prompt_version": prompt_version,
                "created_at": time.time(),
                "created_by": created_by,
                "program_json": program_json,
                "details_json": _dump(details) if details is not None else None,
            },
            refuse_if,
        )
        return TrialRow(
            row["seq"], trial_id, program_hash, origin, parser_model, prompt_version, row["created_at"],
            program_json, created_by, details,
        )  # fmt: skip

    def trial_by_source(self, source_key: str) -> TrialRow | None:
        """The parser's program for a parse-cache key (criteria text + parser model + prompt)."""
        return self._one_trial("WHERE source_key = ? ORDER BY seq DESC LIMIT 1", (source_key,))

    def active_trial(self, trial_id: str) -> TrialRow | None:
        """The version a match on `trial_id` uses: the newest reviewed one, else the newest parser one."""
        return self._one_trial("WHERE trial_id = ? " + ACTIVE_ORDER, (trial_id,))

    def trial_version(self, trial_id: str, program_hash: str) -> TrialRow | None:
        return self._one_trial(
            "WHERE trial_id = ? AND program_hash = ? ORDER BY seq DESC LIMIT 1", (trial_id, program_hash)
        )

    def trial_ids(self) -> list[str]:
        """Every trial id with a stored version, sorted (site-wide screening lists these)."""
        return [r[0] for r in self._select("SELECT DISTINCT trial_id FROM trials ORDER BY trial_id")]

    def active_versions(self) -> dict[str, str]:
        """Every trial's active version (trial id -> program hash), in one query."""
        rows = self._select(
            "SELECT t.trial_id, t.program_hash FROM trials t WHERE t.seq = "
            f"(SELECT seq FROM trials u WHERE u.trial_id = t.trial_id {ACTIVE_ORDER})"
        )
        return dict(rows)

    def trial_versions(self, trial_id: str) -> list[TrialRow]:
        rows = self._select(_TRIAL_SELECT + "WHERE trial_id = ? ORDER BY seq", (trial_id,))
        return [_trial_row(r) for r in rows]

    def _one_trial(self, where: str, args: tuple) -> TrialRow | None:
        rows = self._select(_TRIAL_SELECT + where, args)
        return _trial_row(rows[0]) if rows else None

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
        parent_id: str | None = None,
        lineage: dict[str, Any] | None = None,
    ) -> DecisionRow:
        """Append a decision. With `parent_id` it supersedes that decision: refused (`Superseded`,
        naming the newer one) when another decision superseded it first."""
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
            parent_id=parent_id,
            lineage=lineage,
        )
        columns = {k: getattr(row, k) for k in DECISION_COLUMNS[1:13]}
        columns.update(
            models_json=_dump(models),
            timings_json=_dump(timings),
            artifacts_json=_dump(artifacts),
            note_text=row.note_text,
            parent_id=parent_id,
            lineage_json=_dump(lineage) if lineage is not None else None,
        )
        guard = None
        if parent_id is not None:
            guard = Guard(
                "SELECT decision_id FROM decisions WHERE parent_id = ? LIMIT 1",
                (parent_id,),
                lambda r: Superseded(
                    f"decision '{parent_id}' was already superseded by '{r[0]}': review the current one",
                    [("decision_id", f"superseded by {r[0]}")],
                ),
            )
        self._append("decisions", columns, guard)
        return row

    def decision(self, decision_id: str) -> DecisionRow | None:
        rows = self._select(_DECISION_SELECT + "WHERE decision_id = ?", (decision_id,))
        if not rows:
            return None
        return _decision_row(rows[0])

    def successor(self, decision_id: str) -> str | None:
        """The decision that superseded `decision_id` (its one child), if any."""
        rows = self._select("SELECT decision_id FROM decisions WHERE parent_id = ?", (decision_id,))
        return rows[0][0] if rows else None

    def lineage_ids(self, decision_id: str) -> list[str]:
        """The decision's lineage up to it, oldest first: ids only, in one query (empty if unknown)."""
        rows = self._select(
            "WITH RECURSIVE up(decision_id, parent_id, depth) AS ("
            "SELECT decision_id, parent_id, 0 FROM decisions WHERE decision_id = ? "
            "UNION ALL SELECT d.decision_id, d.parent_id, up.depth + 1 FROM decisions d "
            "JOIN up ON d.decision_id = up.parent_id) SELECT decision_id FROM up ORDER BY depth DESC",
            (decision_id,),
        )
        return [r[0] for r in rows]

    def lineage_head(self, decision_id: str) -> str:
        """The newest decision of `decision_id`'s lineage (itself when nothing supersedes it)."""
        rows = self._select(
            "WITH RECURSIVE down(decision_id, depth) AS ("
            "SELECT decision_id, 0 FROM decisions WHERE decision_id = ? "
            "UNION ALL SELECT d.decision_id, down.depth + 1 FROM decisions d "
            "JOIN down ON d.parent_id = down.decision_id) "
            "SELECT decision_id FROM down ORDER BY depth DESC LIMIT 1",
            (decision_id,),
        )
        return rows[0][0] if rows else decision_id

    def decisions(self, decision_ids: list[str]) -> list[DecisionRow]:
        """The rows of these decisions, in the order given (unknown ids left out)."""
        if not decision_ids:
            return []
        marks = ", ".join("?" for _ in decision_ids)
        rows = {
            r.decision_id: r
            for r in map(_decision_row, self._select(_DECISION_SELECT + f"WHERE decision_id IN ({marks})",
                                                     tuple(decision_ids)))
        }  # fmt: skip
        return [rows[i] for i in decision_ids if i in rows]

    def lineage_changes(
        self, trial_id: str, before_seq: int | None, limit: int
    ) -> list[tuple[int, str, str, dict[str, Any] | None]]:
        """(seq, decision_id, program_hash, lineage) of a trial's superseding decisions, newest first,
        `limit` of them before `before_seq`: no artifacts read."""
        rows = self._select(
            "SELECT seq, decision_id, program_hash, lineage_json FROM decisions "
            "WHERE trial_id = ? AND parent_id IS NOT NULL AND seq < ? ORDER BY seq DESC LIMIT ?",
            (trial_id, before_seq if before_seq is not None else 2**62, limit),
        )
        return [(r[0], r[1], r[2], json.loads(r[3]) if r[3] is not None else None) for r in rows]

    def current_decisions(
        self, *, trial_id: str | None = None, policy_name: str | None = None, patient_id: str | None = None
    ) -> Iterator[DecisionRow]:
        """Decisions no other decision supersedes (the newest of each lineage), oldest first; a
        patient's through the (patient_id, trial_id) index."""
        where, args = [_CURRENT], []
        for column, value in (
            ("trial_id", trial_id),
            ("policy_name", policy_name),
            ("patient_id", patient_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        ids = self._select(
            f"SELECT decision_id FROM decisions WHERE {' AND '.join(where)} ORDER BY seq", tuple(args)
        )
        for (decision_id,) in ids:  # one row at a time: artifacts can be large
            row = self.decision(decision_id)
            if row is not None:
                yield row

    # -- screening runs --------------------------------------------------------------------------
    def add_screening(
        self,
        *,
        created_by: str,
        direction: str,
        source_kind: str,
        source_label: str | None,
        policy_name: str,
        policy_version: str,
        counts: dict[str, Any],
        decision_ids: list[str],
    ) -> ScreeningRow:
        """Append a screening run (after its decisions: every id it lists is already in the chain)."""
        if direction not in SCREENING_DIRECTIONS:
            raise ValueError(f"unknown screening direction '{direction}'")
        row = ScreeningRow(
            "scr_" + uuid.uuid4().hex, time.time(), created_by, direction, source_kind, source_label,
            policy_name, policy_version, counts, list(decision_ids),
        )  # fmt: skip
        columns = {k: getattr(row, k) for k in SCREENING_COLUMNS[1:9]}
        columns.update(counts_json=_dump(counts), decision_ids_json=_dump(row.decision_ids))
        self._append("screenings", columns)
        return row

    def screening(self, screening_id: str) -> ScreeningRow | None:
        rows = self._select(_SCREENING_SELECT + "WHERE screening_id = ?", (screening_id,))
        if not rows:
            return None
        r = rows[0]
        return ScreeningRow(*r[:8], json.loads(r[8]), json.loads(r[9]))

    def count(self, table: str) -> int:
        assert table in TABLES
        return self._select(f"SELECT COUNT(*) FROM {table}")[0][0]

    # -- integrity -------------------------------------------------------------------------------
    def verify(self, head: str | None = None) -> ChainReport:
        """Check the database's own protections and walk the hash chain (see chain.py)."""
        report = ChainReport()
        with self._snapshot():
            report.problems.extend(self._protection_problems())
            streams = {t: self._stream(t) for t in self._tables}  # an older store read as it is
            try:
                return check_chain(merge_by_seq(streams), report, head)
            finally:  # stopped at a bad row: close the cursors before the snapshot ends
                for s in streams.values():
                    s.close()


def tampered(where: str, problems: list[str]) -> str:
    return (
        f"audit store {where}: its append-only protection was changed ({'; '.join(problems[:3])}): "
        "refusing to write to it. Keep it as evidence, run `verdict serve audit verify`, and point "
        "api.audit_db at a new store"
    )


def open_store(api, *, read_only: bool = False) -> AuditStore:
    """The audit store an `ApiConfig` names (`audit_db`, `audit_password_env`, `store_notes`)."""

    if not is_postgres_url(api.audit_db):
        return AuditStore(api.audit_db, api.store_notes, read_only=read_only)
    store = AuditStore(
        api.audit_db, api.store_notes, read_only=read_only, password_env=api.audit_password_env
    )
    warnings = [] if read_only else store.privilege_warnings()
    if warnings:
        logging.getLogger("verdict.serve").warning(
            "audit store: %s; see verdict serve audit setup-postgres", "; ".join(warnings)
        )
    return store


HEAD_SQL = (  # the newest row of the chain, whichever table it is in
    " UNION ALL ".join(
        f"SELECT seq, row_hash FROM (SELECT seq, row_hash FROM {t} ORDER BY seq DESC LIMIT 1) AS {t[0]}"
        for t in TABLES
    )
    + " ORDER BY seq DESC LIMIT 1"
)


@dataclass(frozen=True)
class Guard:
    """A query an append runs in its own transaction; a row returned refuses the append with `error(row)`."""

    sql: str
    args: tuple
    error: Callable[[tuple], Exception]


def schema_version_of(meta: list[tuple[str, str]]) -> int | None:
    """The store's schema version from its meta rows: `schema_version` as created, raised by each
    in-place upgrade's `schema_upgrade:N` row (meta rows are append-only too)."""
    versions = [
        int(v) for k, v in meta if (k == "schema_version" or k.startswith("schema_upgrade:")) and v.isdigit()
    ]
    return max(versions) if versions else None


def _decision_row(r: tuple) -> DecisionRow:
    return DecisionRow(
        *r[:12], json.loads(r[12]), json.loads(r[13]), json.loads(r[14]), r[15], r[16],
        json.loads(r[17]) if r[17] is not None else None,
    )  # fmt: skip


def _trial_row(r: tuple) -> TrialRow:
    return TrialRow(*r[:9], json.loads(r[9]) if r[9] is not None else None)


def _dump(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
