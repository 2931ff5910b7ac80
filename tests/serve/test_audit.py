"""The audit store is append-only in the database itself, private on disk, and round-trips records."""

from __future__ import annotations

import sqlite3
import stat

import pytest

from serve.audit import AuditStore
from serve.errors import ServeConfigError


def add(store: AuditStore, note: str = "A 58-year-old woman.") -> str:
    return store.add_decision(
        created_by="k1",
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


def test_round_trip_and_file_mode(tmp_path):
    path = tmp_path / "a" / "audit.sqlite"
    store = AuditStore(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    t = store.add_trial(
        trial_id="T1",
        program_hash="sha256:aa",
        program_json="{}",
        origin="parser",
        created_by="k1",
        source_key="key1",
        parser_model="parser",
        prompt_version="trial_parser@v1",
    )
    store.add_trial(
        trial_id="T1", program_hash="sha256:dd", program_json="{}", origin="upload", created_by="k2"
    )
    assert store.trial_by_source("key1").seq == t.seq
    assert store.latest_trial("T1").program_hash == "sha256:dd"  # an upload supersedes
    assert store.trial_version("T1", "sha256:aa").origin == "parser"
    assert [r.program_hash for r in store.trial_versions("T1")] == ["sha256:aa", "sha256:dd"]
    did = add(store)
    row = store.decision(did)
    assert (row.trial_id, row.decision, row.timings, row.note_text) == (
        "T1",
        "eligible",
        {"total": 1.5},
        "A 58-year-old woman.",
    )
    assert store.decision("dec_nope") is None
    store.close()
    assert AuditStore(path).count("decisions") == 1  # persisted


def test_updates_and_deletes_are_refused_by_the_database(tmp_path):
    path = tmp_path / "audit.sqlite"
    store = AuditStore(path)
    add(store)
    store.add_trial(
        trial_id="T1", program_hash="sha256:aa", program_json="{}", origin="parser", created_by="k"
    )
    store.close()
    db = sqlite3.connect(path)
    for sql in (
        "UPDATE decisions SET decision = 'ineligible'",
        "DELETE FROM decisions",
        "UPDATE trials SET program_json = '{\"x\":1}'",
        "DELETE FROM trials",
    ):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(sql)
    assert db.execute("SELECT decision FROM decisions").fetchone() == ("eligible",)


def test_store_notes_off_keeps_only_the_hash(tmp_path):
    store = AuditStore(tmp_path / "audit.sqlite", store_notes=False)
    row = store.decision(add(store, note="secret note text"))
    assert row.note_text is None and row.note_hash == "sha256:bb"
    assert b"secret note text" not in (tmp_path / "audit.sqlite").read_bytes()


def test_an_unusable_file_is_a_clear_error(tmp_path):
    p = tmp_path / "audit.sqlite"
    p.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ServeConfigError, match="audit store .* is unusable"):
        AuditStore(p)
