"""The audit store (serve/audit/): append-only in the database itself, one hash chain that
`verdict serve audit verify` checks, explicit trial versions, on both backends (SQLite and a real
PostgreSQL cluster, tests/fixtures/postgres.py). The end-to-end tests run a real `verdict serve
api` process in front of the project's scripted formalizer server.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import sqlite3
import stat
import subprocess

import pytest
from verdict.serve.audit import AuditStore
from verdict.serve.errors import ServeConfigError

from tests.fixtures.postgres import ADMIN_PASSWORD_ENV, PASSWORD_ENV, WRITER
from tests.serve.conftest import start_service, verdict_command
from tests.support import REPO, run_together

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path) -> str:
    """Where a store lives: a SQLite file, or a new PostgreSQL database set up the recommended way
    (schema owned by the administrator, the service's role with SELECT and INSERT only)."""
    if request.param == "sqlite":
        return str(tmp_path / "a" / "audit.sqlite")
    from verdict.serve.audit.postgres import setup_schema

    db = request.getfixturevalue("postgres_db")
    setup_schema(db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    return db.writer_url


def open_store(location: str, **kw) -> AuditStore:
    if location.startswith("postgresql://"):
        kw["password_env"] = PASSWORD_ENV
    return AuditStore(location, **kw)


def add(store: AuditStore, note: str = "A 58-year-old woman.", created_by: str = "k1") -> str:
    return store.add_decision(
        created_by=created_by,
        trial_id="T1",
        program_hash="sha256:aa",
        patient_id="P1",
        note_hash="sha256:bb",
        patient_hash="sha256:cc",
        policy_name="prescreen",
        policy_version="1",
        engine_version="1",
        decision="eligible",
        models={"value_miner": "value_miner"},
        timings={"total": 1.5},
        artifacts={"decision": {"decision": "eligible"}},
        note_text=note,
    ).decision_id


def trial(store: AuditStore, program_hash: str, origin: str = "parser", trial_id: str = "T1", **kw):
    return store.add_trial(
        trial_id=trial_id, program_hash=program_hash, program_json="{}", origin=origin, created_by="k", **kw
    )


def verify_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [*verdict_command(), "serve", "audit", "verify", *args],
        capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip


# ---- both backends ------------------------------------------------------------------------------
def test_round_trip_and_persistence(location):
    store = open_store(location)
    t = trial(store, "sha256:aa", source_key="key1", parser_model="parser", prompt_version="trial_parser@v1")
    assert store.trial_by_source("key1").seq == t.seq and t.created_by == "k" and t.details is None
    up = trial(store, "sha256:dd", origin="upload", details={"ticket": "IRB-7"})
    assert store.active_trial("T1") == up and up.details == {"ticket": "IRB-7"}
    did = add(store)
    row = store.decision(did)
    assert (row.trial_id, row.decision, row.timings, row.note_text, row.created_by) == (
        "T1", "eligible", {"total": 1.5}, "A 58-year-old woman.", "k1",
    )  # fmt: skip
    assert store.decision("dec_nope") is None
    store.close()
    again = open_store(location)
    assert (again.count("trials"), again.count("decisions")) == (2, 1)  # persisted
    assert again.verify().ok


def test_a_reviewed_version_is_never_superseded_by_a_parser_run(location):
    store = open_store(location)
    trial(store, "sha256:p1")
    assert store.active_trial("T1").program_hash == "sha256:p1"  # only parser output: the newest
    trial(store, "sha256:p2")
    assert store.active_trial("T1").program_hash == "sha256:p2"
    trial(store, "sha256:r1", origin="upload")
    trial(store, "sha256:p3")  # a later parser run: stored, not active
    active = store.active_trial("T1")
    assert (active.program_hash, active.origin, active.reviewed) == ("sha256:r1", "upload", True)
    trial(store, "sha256:r2", origin="upload")  # a newer reviewed version supersedes the older one
    assert store.active_trial("T1").program_hash == "sha256:r2"
    assert store.trial_version("T1", "sha256:p3").origin == "parser"  # every version stays selectable
    assert [r.program_hash for r in store.trial_versions("T1")] == [
        "sha256:p1", "sha256:p2", "sha256:r1", "sha256:p3", "sha256:r2",
    ]  # fmt: skip
    assert store.active_trial("T-unknown") is None
    with pytest.raises(ValueError, match="unknown trial origin"):
        trial(store, "sha256:x", origin="imported")  # 'revision' is a real origin since issue 12


def test_active_versions_and_a_patients_current_decisions_in_one_query_each(location):
    """What a CDS Hooks call reads: every trial's active version (as `active_trial` picks it) and one
    patient's current decisions (superseded ones and other patients' left out)."""
    store = open_store(location)
    for program_hash, origin, trial_id in [
        ("sha256:p1", "parser", "T1"), ("sha256:r1", "upload", "T1"), ("sha256:p2", "parser", "T1"),
        ("sha256:q1", "parser", "T2"), ("sha256:q2", "parser", "T2"),
    ]:  # fmt: skip
        trial(store, program_hash, origin=origin, trial_id=trial_id)
    assert store.active_versions() == {"T1": "sha256:r1", "T2": "sha256:q2"}
    assert store.active_versions() == {t: store.active_trial(t).program_hash for t in store.trial_ids()}
    first, other = add(store), add(store)
    row = store.decision(first)
    fields = {k: getattr(row, k) for k in ("trial_id", "program_hash", "note_hash", "patient_hash",
                                           "policy_name", "policy_version", "engine_version", "decision",
                                           "models", "timings", "artifacts", "note_text")}  # fmt: skip
    newer = store.add_decision(created_by="k2", patient_id="P1", parent_id=first, **fields).decision_id
    store.add_decision(created_by="k1", patient_id="P2", **fields)
    assert [r.decision_id for r in store.current_decisions(patient_id="P1")] == [other, newer]
    assert [r.patient_id for r in store.current_decisions(patient_id="P2", policy_name="prescreen")] == ["P2"]
    assert list(store.current_decisions(patient_id="P3")) == []


def test_the_chain_links_every_row_and_verify_checks_a_recorded_head(location):
    store = open_store(location)
    trial(store, "sha256:aa")
    add(store)
    report = store.verify()
    assert report.ok and report.rows == {"trials": 1, "decisions": 1, "screenings": 0} and report.head[0] == 2
    recorded = report.head_text
    add(store)
    assert store.verify(head=recorded).ok  # the chain grew; the recorded head is still in it
    forged = recorded.split(":", 1)[0] + ":sha256:" + "1" * 64
    bad = store.verify(head=forged)
    assert not bad.ok and "differs from the recorded head" in bad.problems[0]
    assert not store.verify(head="9:" + recorded.split(":", 1)[1]).ok  # beyond the end: rows removed


def test_concurrent_writers_keep_one_chain(location):
    """Several stores on one database (as several API replicas), several threads each."""
    stores = [open_store(location) for _ in range(3)]
    errors: list[BaseException] = []

    def write(store):
        try:
            for i in range(15):
                add(store) if i % 3 else trial(store, f"sha256:{i}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    run_together(*(functools.partial(write, s) for s in stores for _ in range(2)))
    assert not errors
    report = stores[0].verify()
    assert report.ok, report.problems
    assert sum(report.rows.values()) == 90 and report.head[0] == 90


def screening(store: AuditStore, decision_ids: list[str]):
    return store.add_screening(
        created_by="k1", direction="trial", source_kind="fhir_ndjson", source_label="export-2024-05",
        policy_name="prescreen", policy_version="1",
        counts={"pairs": 2, "ranked": {"eligible": 1}, "failures": 1}, decision_ids=decision_ids,
    )  # fmt: skip


def test_a_screening_run_is_chained_after_its_decisions(location, request):
    store = open_store(location)
    trial(store, "sha256:aa")
    did = add(store)
    run = screening(store, [did])
    assert store.screening(run.screening_id) == run and store.screening("scr_nope") is None
    report = store.verify()
    assert report.ok and report.rows == {"trials": 1, "decisions": 1, "screenings": 1} and report.head[0] == 3
    add(store)  # the chain goes on after it
    assert store.verify(head=report.head_text).ok
    with pytest.raises(ValueError, match="unknown screening direction"):
        store.add_screening(
            created_by="k1", direction="both", source_kind="api", source_label=None, policy_name="prescreen",
            policy_version="1", counts={}, decision_ids=[],
        )  # fmt: skip
    store.close()
    forged = "UPDATE screenings SET counts_json = '{\"pairs\": 0}' WHERE seq = 3"
    if location.startswith("postgresql://"):
        db = request.getfixturevalue("postgres_db")
        with db.cluster.admin(db.name) as a:
            a.execute("SET search_path = verdict_audit")
            with pytest.raises(Exception, match="append-only: UPDATE on screenings refused"):
                a.execute(forged)
            a.execute("ALTER TABLE screenings DISABLE TRIGGER screenings_append_only")
            a.execute(forged)
        expected = ["trigger screenings_append_only is disabled"]
    else:
        db = sqlite3.connect(location)
        with pytest.raises(sqlite3.DatabaseError, match="append-only: UPDATE on screenings refused"):
            db.execute(forged)
        db.execute("DROP TRIGGER screenings_no_update")
        db.execute(forged)
        db.commit()
        db.close()
        expected = ["trigger screenings_no_update is missing (dropped)"]
    ro = open_store(location, read_only=True)
    assert ro.verify().problems == [
        *expected,
        f"screenings row seq 3 ({run.screening_id}): content does not match its row_hash (rewritten)",
    ]
    ro.close()


def test_store_notes_off_keeps_only_the_hash(location):
    store = open_store(location, store_notes=False)
    row = store.decision(add(store, note="secret note text"))
    assert row.note_text is None and row.note_hash == "sha256:bb"
    if not location.startswith("postgresql://"):
        from pathlib import Path

        assert b"secret note text" not in Path(location).read_bytes()


def test_store_notes_off_hashes_are_keyed_and_older_rows_read_as_unkeyed(location, tmp_path):
    """Issue 22.11a, both backends: new rows carry HMAC references under the store's secret (a file
    0600, created on first use, the same secret when read again); a row from before stays as it was,
    read as unkeyed."""
    from verdict.serve.note_free import note_free
    from verdict.serve.quote_hash import QuoteHasher, quote_hashing

    note = "A 58-year-old woman, smoker."
    key_file = tmp_path / "keys" / "audit_hash.key"
    hasher = QuoteHasher.from_file(key_file)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert QuoteHasher.from_file(key_file).ref("smoker") == hasher.ref("smoker")  # read, not remade
    store = open_store(location, store_notes=False)
    unkeyed = {"patient": {"evidence": "[not kept: sha256:0123456789abcdef, offset 20, 6 chars]"}}
    old = store.decision(add(store, note=note))
    old_id = store.add_decision(**{**_fields(old), "artifacts": unkeyed}).decision_id
    new_id = store.add_decision(
        **{**_fields(old), "artifacts": note_free({"patient": {"evidence": "smoker"}}, note, hasher)}
    ).decision_id
    got_old, got_new = store.decision(old_id), store.decision(new_id)
    assert got_old.artifacts == unkeyed and quote_hashing(got_old.artifacts) == "unkeyed"
    assert quote_hashing(got_new.artifacts) == "keyed" and "smoker" not in json.dumps(got_new.artifacts)
    assert hasher.ref("smoker") in got_new.artifacts["patient"]["evidence"]
    assert hashlib.sha256(b"smoker").hexdigest()[:16] not in got_new.artifacts["patient"]["evidence"]
    assert quote_hashing(old.artifacts) is None and store.verify().ok
    store.close()


def test_note_free_keeps_the_not_asked_mark_and_what_it_hid_before(tmp_path):
    """Issue 23: a re-derivation's artifacts hold its parent's, already note-free, beside new quotes;
    only the new ones are hashed. The not-asked mark (the service's own words) is kept: a later
    review or re-read reads it back to know which atoms were never read."""
    from verdict.core.settled import NOT_ASKED
    from verdict.serve.note_free import note_free
    from verdict.serve.quote_hash import QuoteHasher

    hasher = QuoteHasher.from_file(tmp_path / "audit_hash.key")
    note = "A 58-year-old woman, smoker."
    first = note_free(
        {"patient": [{"atom": "a", "note": NOT_ASKED}, {"atom": "b", "evidence": "smoker", "note": "x"}]},
        note,
        hasher,
    )
    assert first["patient"][0]["note"] == NOT_ASKED and "smoker" not in json.dumps(first)
    again = note_free({**first, "reread": {"evidence": "58-year-old"}}, note, hasher)
    assert again["patient"] == first["patient"]  # hidden once, not hashed again
    assert again["reread"]["evidence"].startswith(f"[not kept: {hasher.ref('58-year-old')}, offset 2,")


def _fields(row) -> dict:
    keep = ("created_by", "trial_id", "program_hash", "patient_id", "note_hash", "patient_hash",
            "policy_name", "policy_version", "engine_version", "decision", "models", "timings")  # fmt: skip
    return {k: getattr(row, k) for k in keep} | {"note_text": None}


# ---- SQLite: the file can be written with sqlite3 ---------------------------------------------------
def test_sqlite_file_is_private_and_an_unusable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "a" / "audit.sqlite"
    AuditStore(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    p = tmp_path / "junk.sqlite"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ServeConfigError, match="audit store .* is unusable"):
        AuditStore(p)


def test_sqlite_schema_1_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
        "CREATE TABLE trials (seq INTEGER PRIMARY KEY AUTOINCREMENT, trial_id TEXT);"
    )
    db.close()
    with pytest.raises(ServeConfigError, match="schema version 1.*new one"):
        AuditStore(path)


@pytest.fixture
def sqlite_store(tmp_path):
    """A store with three rows: trial (seq 1), decisions (seq 2, 3); closed, ready to tamper with."""
    path = tmp_path / "audit.sqlite"
    store = AuditStore(path)
    trial(store, "sha256:aa")
    ids = [add(store), add(store)]
    store.close()
    return path, ids


def test_updates_deletes_and_replace_are_refused_by_the_database(sqlite_store):
    path, _ = sqlite_store
    db = sqlite3.connect(path)
    forged = (
        "INSERT OR REPLACE INTO decisions (seq, decision_id, created_at, created_by, trial_id, program_hash,"
        " patient_id, note_hash, patient_hash, policy_name, policy_version, engine_version, decision,"
        " models_json, timings_json, artifacts_json, note_text, prev_hash, row_hash)"
        " SELECT seq, decision_id, created_at, 'forged-admin', trial_id, program_hash, patient_id, note_hash,"
        " patient_hash, policy_name, policy_version, engine_version, 'ineligible', models_json, timings_json,"
        " artifacts_json, note_text, prev_hash, row_hash FROM decisions WHERE seq = 2"
    )
    for sql in (
        "UPDATE decisions SET decision = 'ineligible'",
        "DELETE FROM decisions",
        "UPDATE trials SET program_json = '{\"x\":1}'",
        "DELETE FROM trials",
        forged,
        "INSERT OR REPLACE INTO trials SELECT * FROM trials WHERE seq = 1",
        "REPLACE INTO meta VALUES ('schema_version', '1')",
    ):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(sql)
    row = db.execute("SELECT decision, created_by FROM decisions WHERE seq = 2").fetchone()
    assert row == ("eligible", "k1")
    db.close()
    assert verify_cli("--db", str(path)).returncode == 0


def _tampered(path, tmp_path, name: str, *sql: str):
    """A copy of the store, changed through sqlite3 after dropping the triggers."""
    from verdict.serve.audit.sqlite import TRIGGERS

    copy = tmp_path / f"{name}.sqlite"
    shutil.copy(path, copy)
    db = sqlite3.connect(copy)
    for t in TRIGGERS:
        db.execute(f"DROP TRIGGER {t}")
    for s in sql:
        db.execute(s)
    db.commit()
    db.close()
    return copy


def test_verify_names_the_first_rewritten_deleted_or_reordered_row(sqlite_store, tmp_path):
    path, ids = sqlite_store
    ok = verify_cli("--db", str(path))
    assert ok.returncode == 0 and ok.stdout.strip().startswith("3:sha256:")
    cases = {
        "replace": (
            ["UPDATE decisions SET created_by = 'forged-admin', decision = 'ineligible' WHERE seq = 2"],
            f"decisions row seq 2 ({ids[0]}): content does not match its row_hash",
        ),
        "delete": (
            ["DELETE FROM decisions WHERE seq = 2"], f"decisions row seq 3 ({ids[1]}): expected seq 2"
        ),
        "reorder": (
            ["UPDATE decisions SET seq = 99 WHERE seq = 2", "UPDATE decisions SET seq = 2 WHERE seq = 3",
             "UPDATE decisions SET seq = 3 WHERE seq = 99"],
            f"decisions row seq 2 ({ids[1]}): prev_hash does not match",
        ),
        "tail": (["DELETE FROM decisions WHERE seq = 3"], None),  # only a recorded head shows this
        "triggers": ([], "trigger trials_no_update is missing"),
    }  # fmt: skip
    for name, (sql, expected) in cases.items():
        copy = _tampered(path, tmp_path, name, *sql)
        r = verify_cli("--db", str(copy), *(["--head", ok.stdout.strip()] if name == "tail" else []))
        assert r.returncode == 1, (name, r.stderr)
        assert "NOT intact" in r.stderr and "trigger trials_no_update is missing" in r.stderr
        assert (expected or "recorded head seq 3 is no longer in the store") in r.stderr, (name, r.stderr)
    db = sqlite3.connect(path)  # reading (verify) left the original untouched
    assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 12


def test_verify_reads_the_store_a_serve_config_names(sqlite_store, tmp_path):
    import yaml

    path, _ = sqlite_store
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(yaml.safe_dump({"api": {"formalizer": {"base_url": "http://127.0.0.1:9/v1"},
                                           "audit_db": str(path)}}))  # fmt: skip
    r = verify_cli("--config", str(cfg))
    assert r.returncode == 0 and "intact, 1 trials, 2 decisions" in r.stderr
    missing = verify_cli("--db", str(tmp_path / "none.sqlite"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr


# ---- PostgreSQL: the database enforces it, also against its own administrator ---------------------
def test_postgres_refuses_changes_from_the_service_role_and_from_the_owner(postgres_db):
    import psycopg
    from verdict.serve.audit.postgres import setup_schema

    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    store = open_store(postgres_db.writer_url)
    assert store.privilege_warnings() == []
    trial(store, "sha256:aa")
    did = add(store)
    cluster = postgres_db.cluster
    with psycopg.connect(postgres_db.writer_url, password=cluster.writer_password, autocommit=True) as w:
        w.execute("SET search_path = verdict_audit")
        for sql in (
            "UPDATE decisions SET decision = 'ineligible'",
            "DELETE FROM decisions",
            "TRUNCATE trials",
            "DROP TRIGGER decisions_append_only ON decisions",
            "ALTER TABLE decisions DISABLE TRIGGER USER",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                w.execute(sql)
    with cluster.admin(postgres_db.name) as a:  # the owner holds the grants: the triggers still refuse
        a.execute("SET search_path = verdict_audit")
        for sql in (
            "UPDATE decisions SET decision = 'ineligible'",
            "DELETE FROM trials",
            "TRUNCATE decisions",
            "INSERT INTO trials SELECT * FROM trials ON CONFLICT (seq) DO UPDATE SET created_by = 'forged'",
        ):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                a.execute(sql)
        with pytest.raises(psycopg.errors.UniqueViolation):  # no REPLACE: an existing key is refused
            a.execute("INSERT INTO trials SELECT * FROM trials")
    assert store.decision(did).decision == "eligible" and store.verify().ok


def test_postgres_verify_names_a_row_rewritten_by_a_superuser(postgres_db):
    from verdict.serve.audit.postgres import setup_schema

    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    store = open_store(postgres_db.writer_url)
    trial(store, "sha256:aa")
    ids = [add(store), add(store)]
    ok = verify_cli("--db", postgres_db.writer_url, "--password-env", PASSWORD_ENV)
    assert ok.returncode == 0 and ok.stdout.strip().startswith("3:sha256:")
    with postgres_db.cluster.admin(postgres_db.name) as a:
        a.execute("SET search_path = verdict_audit")
        a.execute("ALTER TABLE decisions DISABLE TRIGGER decisions_append_only")
        a.execute("UPDATE decisions SET created_by = 'forged-admin' WHERE seq = 2")
    r = verify_cli("--db", postgres_db.writer_url, "--password-env", PASSWORD_ENV)
    assert r.returncode == 1
    assert "trigger decisions_append_only is disabled" in r.stderr
    assert f"decisions row seq 2 ({ids[0]}): content does not match its row_hash" in r.stderr


def test_postgres_url_with_a_password_is_refused_and_an_owner_role_is_warned(postgres_db):
    from verdict.serve.api_config import ApiConfig

    with_password = postgres_db.writer_url.replace(f"{WRITER}@", f"{WRITER}:hunter2@")
    with pytest.raises(ServeConfigError, match="carries a password"):
        AuditStore(with_password)
    with pytest.raises(ValueError, match="carries a password"):
        ApiConfig(audit_db=with_password)
    owner = open_store(postgres_db.writer_url)  # no setup: the service's role creates and owns the schema
    warnings = owner.privilege_warnings()
    assert any("owns verdict_audit.trials" in w for w in warnings)
    assert any("holds UPDATE, DELETE, TRUNCATE on verdict_audit.decisions" in w for w in warnings)
    with pytest.raises(ServeConfigError, match=r"\$NO_SUCH_VAR is not set"):
        AuditStore(postgres_db.writer_url, password_env="NO_SUCH_VAR")


# ---- the service: a match role cannot replace a reviewed program --------------------------------------
def _program(trial_id, inclusion, exclusion_atom):
    return {
        "trial_id": trial_id,
        "atoms": [
            {"name": "age_years", "domain": "int", "kind": "demographic", "unit": "years",
             "definition": "Age in years."},
            {"name": exclusion_atom, "domain": "bool", "kind": "other", "definition": f"{exclusion_atom}."},
        ],
        "cohorts": [{
            "id": "main",
            "inclusion": [{"id": "inc1", "text": "age",
                           "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": inclusion}}],
            "exclusion": [{"id": "exc1", "text": exclusion_atom, "formula": exclusion_atom}],
        }],
    }  # fmt: skip


TRIAL = "T-REVIEWED"
REVIEWED = _program(TRIAL, 18, "is_pregnant")  # adults, not pregnant
AGE = REVIEWED["atoms"][0]
# what the scripted parser answers per criterion (criterion_parser): any age; smokers excluded
ANY_AGE = {"in_scope": True, "atoms": [AGE],
           "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": 0}}  # fmt: skip
SMOKERS = {"in_scope": True, "atoms": [{"name": "is_smoker", "domain": "bool", "kind": "other",
                                        "definition": "is_smoker."}], "formula": "is_smoker"}  # fmt: skip
NOTE = "A 15-year-old girl, pregnant, non-smoker."


def _values(*items) -> dict:
    return {"content": {"values": [{"atom": a, "value": v, "evidence": e} for a, v, e in items]}}


SCRIPT = {
    "rules": [
        {"match": {"contains": ["15-year-old", '"name": "is_pregnant"']},
         "responses": [_values(("is_pregnant", True, "pregnant"))]},
        {"match": {"contains": ["15-year-old", '"name": "is_smoker"']},
         "responses": [_values(("is_smoker", False, "non-smoker"))]},
        {"match": {"contains": ["15-year-old", '"name": "age_years"']},
         "responses": [_values(("age_years", 15, "15-year-old"))]},
        {"match": {"contains": ["Exclusion criterion:\n"]}, "responses": [{"content": SMOKERS}]},
    ],
    "default": {"content": ANY_AGE},  # the parser, for any inclusion criterion
}  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_match_key_cannot_replace_a_reviewed_program(backend, request, tmp_path):
    """Issue 11, item 1: admin uploads; a match key re-parses the trial id (POST /v1/trials, inline
    in /v1/match); every match, batch included, still uses the reviewed program."""
    from verdict.data_gen.scripted_server import Script, ScriptedServer

    api = {"formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"}}
    if backend == "postgresql":
        from verdict.serve.audit.postgres import setup_schema

        db = request.getfixturevalue("postgres_db")
        setup_schema(db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
        api.update(audit_db=db.writer_url, audit_password_env=PASSWORD_ENV)
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    svc = start_service(tmp_path / "svc", srv.url, api)
    try:
        with svc.client("admin") as admin, svc.client("match") as matcher:
            assert matcher.post("/v1/trials", json={"program": REVIEWED}).status_code == 403  # admin only
            up = admin.post("/v1/trials", json={"program": REVIEWED})
            assert up.status_code == 200 and up.json()["active"] is True, up.text
            reviewed = up.json()["program_hash"]
            criteria = {"trial_id": TRIAL, "inclusion": "Anyone of any age.", "exclusion": "Smokers."}
            attack = matcher.post("/v1/trials", json={"text": criteria})
            assert attack.status_code == 200, attack.text
            body = attack.json()
            assert body["origin"] == "parser" and body["program_hash"] != reviewed
            assert (body["active"], body["active_program_hash"]) == (False, reviewed)  # stored, not active
            assert matcher.get(f"/v1/trials/{TRIAL}").json()["program_hash"] == reviewed
            patient = {"patient_id": "P-15", "note": NOTE}
            by_id = matcher.post("/v1/match", json={"trial_id": TRIAL, "patient": patient})
            inline = matcher.post("/v1/match", json={"trial": criteria, "patient": patient})
            for r in (by_id, inline):
                assert r.status_code == 200, r.text
                got = (r.json()["program_hash"], r.json()["decision"]["decision"])
                assert got == (reviewed, "ineligible")
            lines = [json.loads(x) for x in matcher.post(
                "/v1/match/batch", json={"trial_ids": [TRIAL], "patients": [patient]}
            ).text.splitlines()]  # fmt: skip
            assert [(x["status"], x["result"]["program_hash"], x["result"]["decision"]["decision"])
                    for x in lines] == [(200, reviewed, "ineligible")]  # fmt: skip
            # the parser version is still there to audit, and an explicit program_hash selects it
            pinned = matcher.get(f"/v1/trials/{TRIAL}", params={"program_hash": body["program_hash"]})
            assert (pinned.json()["origin"], pinned.json()["active"]) == ("parser", False)
            # Issue 22, item 5: pinning the inactive version is refused to a match key, naming the active one
            pin = {"trial_id": TRIAL, "program_hash": body["program_hash"], "patient": patient}
            refused = matcher.post("/v1/match", json=pin)
            assert refused.status_code == 409 and refused.json()["error"] == "inactive_version", refused.text
            assert reviewed in refused.json()["message"] and "trial_owner" in refused.json()["message"]
            assert refused.json()["problems"] == [
                {"field": "program_hash", "message": f"the active version is {reviewed}"}
            ]
        # a trial_owner key may preview it: the parser's program finds this patient eligible, and
        # every artifact says that this is not the trial's decision
        from verdict.serve.api_keys import KeyStore

        owner_key = KeyStore(svc.folder / "keys.json").add("test-owner", ["match", "trial_owner"])[0]
        with svc.client(None) as owner, svc.client("admin") as admin:
            owner.headers["Authorization"] = f"Bearer {owner_key}"
            used = owner.post("/v1/match", json=pin)
            assert used.status_code == 200 and used.json()["decision"]["decision"] == "eligible", used.text
            version = used.json()["trial_version"]
            assert version == {"program_hash": body["program_hash"], "origin": "parser", "reviewed": False,
                               "active": False, "active_program_hash": reviewed,
                               "use": "preview"}  # fmt: skip
            did = used.json()["decision_id"]
            record = admin.get(f"/v1/decisions/{did}").json()
            assert record["trial_version"] == version and record["artifacts"]["trial_version"] == version
            assert record["artifacts"]["schema_version"] == 1  # the typed record (issue 25)
            page = admin.get(f"/v1/decisions/{did}/page").text
            assert 'id="inactive-version"' in page and "Not the trial&#x27;s decision" in page
            assert reviewed in page and "a preview by the trial&#x27;s owner" in page
            history = admin.get(f"/v1/decisions/{did}/history").json()
            assert history["entries"][-1]["trial_version"] == version
            active_page = admin.get(f"/v1/decisions/{by_id.json()['decision_id']}/page").text
            assert 'id="inactive-version"' not in active_page
            assert by_id.json()["trial_version"]["use"] == "active"
    finally:
        svc.stop()
        srv.stop()
    args = ["--db", db.writer_url, "--password-env", PASSWORD_ENV] if backend == "postgresql" else [
        "--config", str(svc.folder / "serve.yaml")]  # fmt: skip
    r = verify_cli(*args)
    assert r.returncode == 0 and "2 trials, 4 decisions" in r.stderr, r.stderr


def test_postgres_reconnects_after_a_dropped_connection_and_errors_are_503(postgres_db):
    from verdict.serve.audit.postgres import setup_schema
    from verdict.serve.errors import AuditUnavailable

    from tests.fixtures.postgres import free_port

    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    store = open_store(postgres_db.writer_url)
    trial(store, "sha256:aa")
    with postgres_db.cluster.admin(postgres_db.name) as a:  # a server restart, as the replica sees it
        a.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (WRITER,))
    assert store.active_trial("T1").program_hash == "sha256:aa"  # read: reconnected
    add(store)  # append: reconnected before anything was sent
    assert store.verify().ok and store.count("decisions") == 1
    with postgres_db.cluster.admin(postgres_db.name) as a:
        a.execute(f"REVOKE INSERT ON verdict_audit.decisions FROM {WRITER}")
    with pytest.raises(AuditUnavailable, match="failed: permission denied") as e:
        add(store)
    assert e.value.status == 503 and "secret" not in str(e.value)
    down = postgres_db.writer_url.replace(f":{postgres_db.cluster.port}/", f":{free_port()}/")
    with pytest.raises(ServeConfigError, match="unusable: .*unavailable"):
        open_store(down)


def test_a_store_whose_protection_was_removed_is_refused_for_writing(sqlite_store, tmp_path, postgres_db):
    path, _ = sqlite_store
    copy = _tampered(path, tmp_path, "no-triggers")
    with pytest.raises(ServeConfigError, match="trigger trials_no_update is missing.*refusing to write"):
        AuditStore(copy)
    assert AuditStore(copy, read_only=True).verify().problems[0].startswith("trigger ")  # verify still reads
    from verdict.serve.audit.postgres import setup_schema

    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    with postgres_db.cluster.admin(postgres_db.name) as a:
        a.execute("ALTER TABLE verdict_audit.trials DISABLE TRIGGER trials_append_only")
    with pytest.raises(ServeConfigError, match="trigger trials_append_only is disabled.*refusing to write"):
        open_store(postgres_db.writer_url)


# ---- schema 3 -> 4: the screenings table added in place ---------------------------------------------
def make_schema_3_store(path) -> str:
    """A schema-3 SQLite store as the previous release wrote it (no screenings table), with a trial and
    a decision; returns the head's hash."""
    from verdict.serve.audit.chain import link
    from verdict.serve.audit.sqlite import _SCHEMA, TRIGGERS
    from verdict.serve.audit.store import COLUMNS

    db = sqlite3.connect(path, isolation_level=None)
    schema = _SCHEMA.split("CREATE TABLE IF NOT EXISTS screenings")[0]
    for stmt in [s for s in schema.split(";") if s.strip()] + list(TRIGGERS.values()):
        db.execute(stmt)
    db.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    rows = {
        "trials": {"trial_id": "T1", "program_hash": "sha256:aa", "source_key": None, "origin": "upload",
                   "parser_model": None, "prompt_version": None, "created_at": 1.0, "created_by": "k",
                   "program_json": "{}", "details_json": None},
        "decisions": {"decision_id": "dec_old", "created_at": 2.0, "created_by": "k", "trial_id": "T1",
                      "program_hash": "sha256:aa", "patient_id": "P1", "note_hash": "sha256:n",
                      "patient_hash": "sha256:p", "policy_name": "prescreen", "policy_version": "1",
                      "engine_version": "e", "decision": "eligible", "models_json": "{}",
                      "timings_json": "{}", "artifacts_json": "{}", "note_text": "note", "parent_id": None,
                      "lineage_json": None},
    }  # fmt: skip
    head = None
    for table, columns in rows.items():
        row = link(table, columns, head)
        names = COLUMNS[table]
        db.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                   [row[c] for c in names])  # fmt: skip
        head = (row["seq"], row["row_hash"])
    db.close()
    return head[1]


def test_a_schema_3_store_is_verified_as_is_then_upgraded_in_place(tmp_path):
    from verdict.serve.audit.sqlite import TRIGGERS, TRIGGERS_4

    path = tmp_path / "v3.sqlite"
    head = make_schema_3_store(path)
    ro = AuditStore(path, read_only=True)  # verify reads it as it is, changing nothing
    report = ro.verify()
    ro.close()
    assert report.ok and report.head == (2, head) and report.rows["screenings"] == 0, report.problems
    store = AuditStore(path)  # a writer adds the table and its triggers; no row is rewritten
    assert store.decision("dec_old").decision == "eligible"
    run = screening(store, ["dec_old"])
    assert store.screening(run.screening_id).decision_ids == ["dec_old"]
    report = store.verify(f"2:{head}")  # the old head is still in the chain
    assert report.ok and report.head[0] == 3
    store.close()
    db = sqlite3.connect(path)
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    triggers = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE screenings SET source_label = 'x'")
    db.close()
    assert meta == {"schema_version": "3", "schema_upgrade:4": "4"}
    assert triggers == set(TRIGGERS) | set(TRIGGERS_4)
    again = AuditStore(path)  # reopening an upgraded store changes nothing
    assert again.count("screenings") == 1 and again.verify().ok
    again.close()


def test_a_postgres_schema_3_store_is_upgraded_by_its_owner_only(postgres_db):
    import psycopg
    from verdict.serve.audit.postgres import setup_schema

    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    store = open_store(postgres_db.writer_url)
    trial(store, "sha256:aa")
    did = add(store)
    store.close()
    with postgres_db.cluster.admin(postgres_db.name) as a:  # back to what the previous release created
        a.execute("SET search_path = verdict_audit")
        a.execute("DROP TABLE screenings")  # its triggers go with it
        a.execute("ALTER TABLE audit_meta DISABLE TRIGGER audit_meta_append_only")
        a.execute("UPDATE audit_meta SET value = '3' WHERE key = 'schema_version'")
        a.execute("ALTER TABLE audit_meta ENABLE TRIGGER audit_meta_append_only")
    ro = open_store(postgres_db.writer_url, read_only=True)
    assert ro.verify().ok  # verify reads schema 3 as it is
    ro.close()
    with pytest.raises(ServeConfigError, match="schema version 3.*setup-postgres"):  # the writer cannot
        open_store(postgres_db.writer_url)
    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)  # the owner upgrades, grants
    store = open_store(postgres_db.writer_url)
    run = screening(store, [did])
    assert store.screening(run.screening_id).decision_ids == [did] and store.verify().ok
    store.close()
    with postgres_db.cluster.admin(postgres_db.name) as a:
        meta = dict(a.execute("SELECT key, value FROM verdict_audit.audit_meta").fetchall())
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            a.execute("DELETE FROM verdict_audit.screenings")
    assert meta == {"schema_version": "3", "schema_upgrade:4": "4"}
