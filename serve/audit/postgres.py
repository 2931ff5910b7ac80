"""The audit store in PostgreSQL, for several API replicas (psycopg 3).

    api.audit_db: postgresql://verdict_writer@db.site:5432/verdict   # no password in the config
    api.audit_password_env: VERDICT_AUDIT_PASSWORD                   # or libpq's PGPASSWORD

Tables live in the schema `verdict_audit`. What the database enforces:
- triggers refuse UPDATE and DELETE (row level; `INSERT ... ON CONFLICT DO UPDATE` fires them too)
  and TRUNCATE on every table; an existing key is refused by the primary key itself;
- with `verdict serve audit setup-postgres --writer ROLE`, the tables belong to the administrator
  and the service's role holds only SELECT and INSERT: it can neither change rows nor drop or
  disable the triggers (only an owner or superuser can);
- one hash chain across all replicas: each append takes a transaction-level advisory lock, reads
  the head and inserts the next row in the same transaction, so writers queue for the lock, never
  fork the chain.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from ..errors import AuditUnavailable, ServeConfigError
from .chain import link
from .store import (
    COLUMNS,
    HEAD_SQL,
    LINEAGE_COLUMNS,
    SCHEMA_VERSION,
    TABLES,
    UPGRADES_FROM,
    AuditStore,
    schema_version_of,
    tables_of,
    tampered,
)

SCHEMA = "verdict_audit"
CHAIN_LOCK = 0x76657264  # advisory-lock key of the chain ("verd")
_TYPES = {"seq": "bigint PRIMARY KEY", "created_at": "double precision NOT NULL",
          "decision_id": "text NOT NULL UNIQUE", "screening_id": "text NOT NULL UNIQUE"}  # fmt: skip
_NULLABLE = {"source_key", "parser_model", "prompt_version", "details_json", "note_text", "source_label",
             *LINEAGE_COLUMNS}  # fmt: skip
_TABLES = ("audit_meta", *TABLES)


def _table_sql(table: str) -> str:
    cols = [f"{c} {_TYPES.get(c, 'text' if c in _NULLABLE else 'text NOT NULL')}" for c in COLUMNS[table]]
    return f"CREATE TABLE {table} ({', '.join(cols)})"


def _triggers(table: str) -> list[str]:
    return [
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} FOR EACH ROW "
        + "EXECUTE FUNCTION refuse_change()",
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} FOR EACH STATEMENT "
        + "EXECUTE FUNCTION refuse_change()",
    ]


# Schema 4: the screenings table, with its triggers (created so by a schema-2 or -3 store's upgrade too).
_SCREENINGS = [
    _table_sql("screenings"),
    "CREATE INDEX screenings_by_time ON screenings (created_at)",
    *_triggers("screenings"),
]
_DDL = [
    "CREATE TABLE audit_meta (key text PRIMARY KEY, value text NOT NULL)",
    _table_sql("trials"),
    "CREATE INDEX trials_by_id ON trials (trial_id, seq)",
    "CREATE INDEX trials_by_source ON trials (source_key)",
    "CREATE INDEX trials_by_hash ON trials (program_hash)",
    _table_sql("decisions"),
    "CREATE INDEX decisions_by_pair ON decisions (patient_id, trial_id)",
    "CREATE UNIQUE INDEX decisions_by_parent ON decisions (parent_id)",  # a decision has one successor
    (
        "CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'audit store is append-only: % on % refused', TG_OP, TG_TABLE_NAME; END $$"
    ),
    *[stmt for t in _TABLES if t != "screenings" for stmt in _triggers(t)],
    *_SCREENINGS,
]
# In-place upgrades (as the tables' owner), by the schema they reach; no existing row is rewritten.
_UPGRADE_3 = [  # NULL in every existing row
    "ALTER TABLE decisions ADD COLUMN IF NOT EXISTS parent_id text",
    "ALTER TABLE decisions ADD COLUMN IF NOT EXISTS lineage_json text",
    "CREATE UNIQUE INDEX IF NOT EXISTS decisions_by_parent ON decisions (parent_id)",
]


def triggers_of(version: int | None) -> list[str]:
    """The triggers a store of this schema has (an older store read by verify lacks the newer tables')."""
    tables = ("audit_meta", *tables_of(version))
    return [f"{t}_{kind}" for t in tables for kind in ("append_only", "no_truncate")]


TRIGGERS = triggers_of(SCHEMA_VERSION)


class PostgresAuditStore(AuditStore):
    """One connection, one lock per replica; the chain lock is in the database."""

    backend = "postgresql"

    def __init__(
        self,
        location: str,
        store_notes: bool = True,
        *,
        read_only: bool = False,
        password_env: str | None = None,
    ):
        parts = urlsplit(location)
        if parts.password:
            raise ServeConfigError(
                "api.audit_db: the PostgreSQL URL carries a password; remove it and name an environment "
                "variable with api.audit_password_env (or set PGPASSWORD)"
            )
        self.location = location
        self.where = f"{parts.hostname or 'local socket'}:{parts.port or 5432}{parts.path}"
        self.store_notes = store_notes
        self.read_only = read_only
        # A stuck chain lock or a hung server is a 503 after these, never a request that hangs.
        self._connect_args: dict[str, Any] = {
            "options": f"-c search_path={SCHEMA} -c lock_timeout=10s -c statement_timeout=60s"
        }
        if password_env:
            password = os.environ.get(password_env)
            if not password:
                raise ServeConfigError(f"api.audit_password_env: ${password_env} is not set")
            self._connect_args["password"] = password
        # Two connections: a read never queues behind an append waiting for the chain lock.
        self._conns: dict[str, Any] = {"read": None, "write": None}
        self._locks = {k: threading.Lock() for k in self._conns}
        try:
            with self._using("read"):
                pass
            if not read_only:
                self._create_schema()
            self._check_schema_version()
            if not read_only:
                with self._using("read") as conn:
                    self._snap = conn
                    problems = self._protection_problems()
                if problems:
                    raise ServeConfigError(tampered(self.where, problems))
        except AuditUnavailable as e:
            raise ServeConfigError(f"audit store {self.where} is unusable: {e.summary}") from None

    # -- connection ------------------------------------------------------------------------------
    @contextmanager
    def _using(self, kind: str):
        """The read or write connection, held alone; reconnected when broken. Database errors become
        a 503 (nothing recorded) with the server's first line only."""
        import psycopg  # heavy optional dependency: psycopg (serve extra: the PostgreSQL store only)

        with self._locks[kind]:
            conn = self._conns[kind]
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = self._conns[kind] = psycopg.connect(
                        self.location, autocommit=True, connect_timeout=10, **self._connect_args
                    )
                    if self.read_only:
                        conn.execute("SET default_transaction_read_only = on")
                yield conn
            except psycopg.Error as e:
                what = "is unavailable" if isinstance(e, psycopg.OperationalError) else "failed"
                raise AuditUnavailable(f"the audit store at {self.where} {what}: {_first_line(e)}") from None

    def close(self) -> None:
        for kind in self._conns:
            with self._locks[kind]:
                if self._conns[kind] is not None:
                    self._conns[kind].close()

    # -- schema ----------------------------------------------------------------------------------
    def _create_schema(self) -> None:
        import psycopg  # heavy optional dependency: psycopg (serve extra: the PostgreSQL store only)

        with self._using("write") as conn:
            with conn.transaction():  # replicas starting at once: one creates, the others wait
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (CHAIN_LOCK,))
                version = _version(conn) if _schema_exists(conn) else None
                if version in UPGRADES_FROM:
                    try:
                        if version < 3:
                            for stmt in _UPGRADE_3:
                                conn.execute(stmt)
                        if not _exists(conn, "screenings"):
                            for stmt in _SCREENINGS:
                                conn.execute(stmt)
                    except psycopg.errors.InsufficientPrivilege:
                        raise ServeConfigError(
                            f"audit store {self.where} has schema version {version}; upgrade it to "
                            f"{SCHEMA_VERSION} once as its owner: verdict serve audit setup-postgres --url "
                            "ADMIN_URL --writer ROLE (adds the lineage columns and the screenings table, "
                            "rewrites no row)"
                        ) from None
                    for to in range(version + 1, SCHEMA_VERSION + 1):
                        conn.execute(
                            "INSERT INTO audit_meta VALUES (%s, %s)", (f"schema_upgrade:{to}", str(to))
                        )
                if not _schema_exists(conn):
                    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
                    for stmt in _DDL:
                        conn.execute(stmt)
                    conn.execute(
                        "INSERT INTO audit_meta VALUES ('schema_version', %s)", (str(SCHEMA_VERSION),)
                    )

    def _check_schema_version(self) -> None:
        with self._using("read") as conn:
            if not _schema_exists(conn):
                raise ServeConfigError(f"audit store {self.where} has no {SCHEMA}.trials table")
            version = _version(conn)
            present = {
                r[0] for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
                    "table_name = 'decisions'", (SCHEMA,),
                ).fetchall()
            }  # fmt: skip
        self._columns = {
            t: tuple(c for c in names if t != "decisions" or c in present) for t, names in COLUMNS.items()
        }
        self._tables, self._schema_version = tables_of(version), version
        # verify (read-only) also reads an older store as it is: it never changes evidence
        if version != SCHEMA_VERSION and not (self.read_only and version in UPGRADES_FROM):
            raise ServeConfigError(
                f"audit store {self.where} has schema version {version or 'none'}, this service "
                f"writes {SCHEMA_VERSION}"
            )

    # -- rows ------------------------------------------------------------------------------------
    def _append(self, table: str, columns: dict[str, Any], refuse_if=None) -> dict[str, Any]:
        names = COLUMNS[table]
        insert = f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
        for attempt in (1, 2):
            sent = False
            try:
                with self._using("write") as conn:
                    with conn.transaction():
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (CHAIN_LOCK,))  # until commit
                        found = (
                            refuse_if
                            and conn.execute(refuse_if.sql.replace("?", "%s"), refuse_if.args).fetchone()
                        )
                        if found:
                            raise refuse_if.error(tuple(found))
                        head = conn.execute(HEAD_SQL).fetchone()
                        row = link(table, columns, tuple(head) if head else None)
                        sent = True
                        conn.execute(insert, tuple(row[n] for n in names))
                return row
            except AuditUnavailable:
                # A connection dropped before the row was sent (server restart, idle cut): once more,
                # on a new one. After it was sent, the commit may have happened: the caller decides.
                if sent or attempt == 2 or not self._dropped("write"):
                    raise
        raise AssertionError("unreachable")

    def _select(self, sql: str, args: tuple = ()) -> list[tuple]:
        for attempt in (1, 2):
            try:
                with self._using("read") as conn:
                    return conn.execute(sql.replace("?", "%s"), args).fetchall()
            except AuditUnavailable:
                if attempt == 2 or not self._dropped("read"):
                    raise
        raise AssertionError("unreachable")

    def _dropped(self, kind: str) -> bool:
        conn = self._conns[kind]
        return conn is not None and (conn.closed or conn.broken)

    @contextmanager
    def _snapshot(self):
        """One consistent view of both tables while replicas keep writing."""
        with self._using("read") as conn:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                self._snap = conn
                yield

    def _stream(self, table: str) -> Iterator[dict[str, Any]]:
        names = self._columns[table]  # an older store read by verify has no lineage columns
        with self._snap.cursor(name=f"verify_{table}") as cur:  # server side: rows in batches
            cur.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY seq")
            for r in cur:
                yield dict(zip(names, r))

    def _protection_problems(self) -> list[str]:
        rows = self._snap.execute(
            "SELECT t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
            (SCHEMA,),
        ).fetchall()
        have = dict(rows)
        problems = []
        for name in triggers_of(self._schema_version):
            if name not in have:
                problems.append(f"trigger {name} is missing (dropped)")
            elif have[name] == "D":
                problems.append(f"trigger {name} is disabled")
        return problems

    def privilege_warnings(self) -> list[str]:
        """What the connected role could do that a writer should not (an owner can drop triggers)."""
        with self._using("read") as conn:
            warnings = []
            for t in _TABLES:
                owner = conn.execute(
                    "SELECT pg_get_userbyid(relowner) = current_user FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                    (SCHEMA, t),
                ).fetchone()
                if owner and owner[0]:
                    warnings.append(f"the service's role owns {SCHEMA}.{t} (it could drop the triggers)")
                held = [
                    p
                    for p in ("UPDATE", "DELETE", "TRUNCATE")
                    if conn.execute("SELECT has_table_privilege(%s, %s)", (f"{SCHEMA}.{t}", p)).fetchone()[0]
                ]
                if held:
                    warnings.append(f"the service's role holds {', '.join(held)} on {SCHEMA}.{t}")
        return warnings


def setup_schema(admin_url: str, writer: str, *, password_env: str | None = None) -> list[str]:
    """As an administrator: create the schema (tables, triggers) owned by the administrator, and let
    the role `writer` (the service's) only read and append. Returns what was done."""
    import psycopg  # heavy optional dependency: psycopg (serve extra: the PostgreSQL store only)

    # heavy optional dependency: psycopg (serve extra: the PostgreSQL store only)
    from psycopg import sql

    store = PostgresAuditStore(admin_url, password_env=password_env)  # creates the schema if absent
    done = [f"schema {SCHEMA} ready at {store.where}"]
    with store._using("write") as conn:
        try:
            with conn.transaction():
                role = sql.Identifier(writer)
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(SCHEMA), role))
                for t in _TABLES:
                    table = sql.Identifier(SCHEMA, t)
                    conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(table, role))
                    conn.execute(sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(table, role))
        except psycopg.errors.UndefinedObject:
            raise ServeConfigError(f"--writer: no role '{writer}' in the database") from None
    store.close()
    done.append(f"role {writer}: SELECT and INSERT only on {', '.join(_TABLES)}")
    return done


def _version(conn) -> int | None:
    return schema_version_of([tuple(r) for r in conn.execute("SELECT key, value FROM audit_meta").fetchall()])


def _schema_exists(conn) -> bool:
    return _exists(conn, "trials")


def _exists(conn, table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.{table}",)).fetchone()[0]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
