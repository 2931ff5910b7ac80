"""The review loop (issue 12): reviews re-derive a decision with the core (no LLM call) and append
a superseding decision with its lineage; history; trial revisions; flags; the lineage in both audit
backends and the upgrade of a schema-2 store. Real HTTP against a real `verdict serve api` process
in front of the project's scripted formalizer server.
"""

from __future__ import annotations

import functools
import sqlite3
import subprocess

import pytest

from tests.serve.conftest import start_service, verdict_command
from tests.support import REPO, run_together

TRIAL = "T-REVIEW"
NOTE = "Patient is 45 years old. Creatinine 3.1 mg/dL on admission."
SCRIPT = {
    "rules": [
        {
            "match": {"contains": ["Creatinine 3.1"]},
            "responses": [
                {
                    "auto": "nulls",
                    "auto_values": {
                        "age_years": {"value": 45, "evidence": "45 years old"},
                        "creatinine": {"value": 3.1, "evidence": "Creatinine 3.1 mg/dL"},
                    },
                }
            ],
        },
    ],
    "default": {"auto": "nulls"},
}
CONFIG = {
    "formalizer": {
        "parser_model": "scripted",
        "value_miner_model": "scripted",
        "max_tokens": {"parser": 2048, "miner_inclusion": 1024, "miner_exclusion": 1024},
    },
    "solver_timeout_ms": 2000,
    # small bounds, so that a test reaches them (issue 22, item 4)
    "reviews": {"max_reviews_per_lineage": 6, "max_review_chars": 9000, "max_flag_note_chars": 1000},
}


def atom(name, domain="bool", unit=None, definition=None):
    out = {"name": name, "domain": domain, "kind": "other", "definition": definition or f"Quantity {name}."}
    return {**out, "unit": unit} if unit else out


def program(trial_id=TRIAL, age_min=18, extra_inclusion=()):
    return {
        "trial_id": trial_id,
        "atoms": [atom("age_years", "int", "years"), atom("has_t2dm", definition="Has type 2 diabetes."),
                  atom("creatinine", "real", "mg/dL"), atom("pregnant", definition="Is pregnant.")],
        "cohorts": [{
            "id": "main",
            "inclusion": [
                {"id": "inc_age", "text": f"Age {age_min} or older",
                 "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": age_min}},
                {"id": "inc_dm", "text": "Type 2 diabetes", "formula": "has_t2dm"},
                {"id": "inc_cr", "text": "Creatinine at most 2.0 mg/dL",
                 "formula": {"op": "cmp", "lhs": "creatinine", "rel": "le", "rhs": 2.0}},
                *extra_inclusion,
            ],
            "exclusion": [{"id": "exc_preg", "text": "Pregnancy", "formula": "pregnant"}],
        }],
    }  # fmt: skip


@pytest.fixture(scope="module")
def svc(tmp_path_factory, scripted):
    from verdict.serve.api_keys import KeyStore

    s = start_service(tmp_path_factory.mktemp("reviews"), scripted.url, CONFIG)
    store = KeyStore(s.folder / "keys.json")
    for role in ("review", "trial_owner"):
        s.keys[role] = store.add(f"test-{role}", [role])[0]
    with s.client("admin") as admin:
        assert admin.post("/v1/trials", json={"program": program()}).status_code == 200
    yield s
    s.stop()


def match(svc) -> dict:
    with svc.client("match") as c:
        r = c.post("/v1/match", json={"trial_id": TRIAL, "patient": {"patient_id": "P1", "note": NOTE}})
    assert r.status_code == 200, r.text
    return r.json()


def verify(svc) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*verdict_command(), "serve", "audit", "verify", "--db", str(svc.folder / "audit.sqlite")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


CORRECT = {
    "type": "correct",
    "atom": "creatinine",
    "value": "1.3 mg/dL",
    "reason": "3.1 was last year's value",
    "evidence": "Creatinine 1.3 mg/dL (lab 2026-11-30)",
}
CONFIRM = {
    "type": "confirm",
    "atom": "has_t2dm",
    "value": True,
    "established": "screening_visit",
    "reason": "confirmed at the visit: HbA1c 7.9%",
}
FLAG = {
    "type": "flag",
    "criterion": "inc_cr",
    "note": "the trial says 'at most 1.5 x ULN', not 2.0",
    "reason": "protocol section 5.1",
}


def test_a_review_rederives_with_the_core_and_supersedes_with_its_lineage(svc, scripted):
    first = match(svc)
    assert first["decision"]["decision"] == "ineligible"  # creatinine 3.1 > 2.0
    calls = len(scripted.requests)
    with svc.client("review") as c:
        r = c.post(
            f"/v1/decisions/{first['decision_id']}/reviews", json={"changes": [CORRECT, CONFIRM, FLAG]}
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(scripted.requests) == calls  # no formalizer call
    assert body["parent_id"] == first["decision_id"] and body["decision_id"] != first["decision_id"]
    assert (body["previous_decision"], body["result"]["decision"]["decision"], body["changed"]) == (
        "ineligible",
        "eligible",
        True,
    )
    res = {x["atom"]: x for x in body["result"]["patient"]["resolutions"]}
    assert (
        res["creatinine"]["status"],
        res["creatinine"]["value"],
        res["creatinine"]["evidence_source"],
    ) == ("observed", 1.3, "reviewer")
    assert (res["has_t2dm"]["value"], res["has_t2dm"]["evidence_source"]) == (True, "screening_visit")
    assert res["age_years"]["value"] == 45 and res["pregnant"]["status"] == "unresolved"  # kept; still open
    assert [a["atom"] for a in body["result"]["rationale"]["to_confirm"]] == ["pregnant"]
    new_id = body["decision_id"]
    with svc.client("audit") as a:
        hist = a.get(f"/v1/decisions/{new_id}/history").json()
        old = a.get(f"/v1/decisions/{first['decision_id']}").json()
        stored = a.get(f"/v1/decisions/{new_id}").json()
        old_hist = a.get(f"/v1/decisions/{first['decision_id']}/history").json()
        assert a.get(f"/v1/decisions/{new_id}/page").status_code == 200  # the page shows a reviewed decision
    assert [e["decision_id"] for e in hist["entries"]] == [first["decision_id"], new_id]
    assert [e["kind"] for e in hist["entries"]] == ["match", "review"]
    changes = hist["entries"][1]["changes"]
    assert [(ch["type"], ch["reason"]) for ch in changes] == [
        ("correct", CORRECT["reason"]),
        ("confirm", CONFIRM["reason"]),
        ("flag", FLAG["reason"]),
    ]
    assert all(
        ch["roles"] == ["review"] and ch["reviewer"] == svc.keys["review"].split("_")[1] for ch in changes
    )
    assert changes[0]["previous"] == {"status": "observed", "value": 3.1, "source": "note"}
    assert hist["entries"][1]["policy"] == {"name": "prescreen", "version": "1"}
    assert old["decision"] == "ineligible"  # the old row is never edited
    assert stored["decision"] == "eligible" and stored["note_stored"] is True
    assert (stored["parent_id"], old["parent_id"]) == (
        first["decision_id"],
        None,
    )  # the record shows its lineage
    assert stored["lineage"]["kind"] == "review" and [ch["type"] for ch in stored["lineage"]["changes"]] == [
        "correct",
        "confirm",
        "flag",
    ]
    assert (old_hist["superseded"], old_hist["current_id"]) == (True, new_id)
    with svc.client("trial_owner") as o:
        flags = o.get(f"/v1/trials/{TRIAL}/flags").json()["flags"]
    assert [(f["criterion"], f["decision_id"]) for f in flags] == [("inc_cr", new_id)]
    # a superseded decision is not reviewed again: 409 naming the current one
    with svc.client("review") as c:
        again = c.post(f"/v1/decisions/{first['decision_id']}/reviews", json={"changes": [CONFIRM]})
    assert again.status_code == 409 and new_id in again.json()["message"]
    # a flag alone keeps the decision (a new row with changed = false)
    with svc.client("review") as c:
        flagged = c.post(f"/v1/decisions/{new_id}/reviews", json={"changes": [FLAG]}).json()
    assert (flagged["changed"], flagged["result"]["decision"]["decision"]) == (False, "eligible")
    v = verify(svc)
    assert v.returncode == 0, v.stderr


@pytest.mark.parametrize(
    "change, field",
    [
        ({**CONFIRM, "atom": "no_such_atom"}, "changes.0.atom"),
        ({**CONFIRM, "value": "abc"}, "changes.0.value"),
        ({**CORRECT, "value": True}, "changes.0.value"),  # a boolean for a real atom
        ({**CORRECT, "value": "1.3 mmol/L"}, "changes.0.value"),  # not the atom's unit
        ({**CORRECT, "atom": "age_years", "value": 45.5}, "changes.0.value"),  # int atom
        ({**CORRECT, "value": 10**400}, "changes.0.value"),
        ({**CORRECT, "value": "1e999"}, "changes.0.value"),
        ({**FLAG, "criterion": "inc_nope"}, "changes.0.criterion"),
        ({**CONFIRM, "reason": ""}, "changes.0.confirm.reason"),
        ({**CONFIRM, "reason": "x" * 5000}, "changes.0.confirm.reason"),
        ({**CONFIRM, "established": "hearsay"}, "changes.0.confirm.established"),
    ],
)
def test_bad_changes_are_422_naming_the_change(svc, change, field):
    did = match(svc)["decision_id"]
    with svc.client("review") as c:
        r = c.post(f"/v1/decisions/{did}/reviews", json={"changes": [change]})
    assert r.status_code == 422, r.text
    assert field in [p["field"] for p in r.json()["problems"]]
    with svc.client("audit") as a:
        assert a.get(f"/v1/decisions/{did}/history").json()["superseded"] is False  # nothing written


def test_roles_limits_and_unknown_decisions(svc):
    did = match(svc)["decision_id"]
    with svc.client("match") as c:
        assert c.post(f"/v1/decisions/{did}/reviews", json={"changes": [CONFIRM]}).status_code == 403
        assert c.get(f"/v1/decisions/{did}/history").status_code == 403
    with svc.client("review") as c:
        assert (
            c.post(f"/v1/trials/{TRIAL}/revisions", json={"program": program(), "reason": "x"}).status_code
            == 403
        )
        many = c.post(f"/v1/decisions/{did}/reviews", json={"changes": [FLAG] * 51})
        assert many.status_code == 422 and many.json()["problems"][0]["field"] == "changes"
        assert c.post(f"/v1/decisions/{did}/reviews", json={"changes": []}).status_code == 422
        missing = c.post("/v1/decisions/dec_nope/reviews", json={"changes": [CONFIRM]})
        assert missing.status_code == 404
        twice = c.post(
            f"/v1/decisions/{did}/reviews", json={"changes": [CONFIRM, {**CONFIRM, "value": False}]}
        )
        assert twice.status_code == 422 and twice.json()["problems"][0]["field"] == "changes.1.atom"
    with svc.client(None) as anon:
        assert anon.post(f"/v1/decisions/{did}/reviews", content=b"{not json").status_code == 401


def test_concurrent_reviews_of_one_decision_give_one_successor(svc):
    did = match(svc)["decision_id"]
    statuses, bodies = [], []

    def review(value):
        with svc.client("review") as c:
            r = c.post(f"/v1/decisions/{did}/reviews", json={"changes": [{**CONFIRM, "value": value}]})
        statuses.append(r.status_code)
        bodies.append(r.json())

    run_together(*(functools.partial(review, v) for v in (True, False, True, False)))
    assert sorted(statuses) == [200, 409, 409, 409], bodies
    winner = next(b for b in bodies if "decision_id" in b)["decision_id"]
    with svc.client("audit") as a:
        assert a.get(f"/v1/decisions/{did}/history").json()["current_id"] == winner
    assert verify(svc).returncode == 0


def test_a_revision_is_checked_becomes_active_and_keeps_the_old_version(svc):
    with svc.client("audit") as a:
        before = a.get(f"/v1/trials/{TRIAL}").json()
    bad = program(
        extra_inclusion=[
            {
                "id": "inc_young",
                "text": "Under 10",
                "formula": {"op": "cmp", "lhs": "age_years", "rel": "lt", "rhs": 10},
            }
        ]
    )
    with svc.client("trial_owner") as o:
        r = o.post(f"/v1/trials/{TRIAL}/revisions", json={"program": bad, "reason": "add a criterion"})
        assert r.status_code == 422, r.text  # no patient can satisfy it
        other = o.post(f"/v1/trials/{TRIAL}/revisions", json={"program": program("T-OTHER"), "reason": "x"})
        assert other.status_code in (404, 422)
        stale = o.post(
            f"/v1/trials/{TRIAL}/revisions",
            json={"program": program(age_min=21), "reason": "x", "revises": "sha256:" + "0" * 64},
        )
        assert stale.status_code == 409
    with svc.client("audit") as a:
        assert a.get(f"/v1/trials/{TRIAL}").json()["program_hash"] == before["program_hash"]  # unchanged
    with svc.client("trial_owner") as o:
        ok = o.post(
            f"/v1/trials/{TRIAL}/revisions",
            json={"program": program(age_min=21), "reason": "protocol amendment 2: adults 21+"},
        )
    assert ok.status_code == 200, ok.text
    rev = ok.json()
    assert (rev["trial"]["origin"], rev["trial"]["active"], rev["revises"]) == (
        "revision",
        True,
        before["program_hash"],
    )
    with svc.client("admin") as admin:
        # the old version stays readable by its hash; the revision is the active one
        old = admin.get(f"/v1/trials/{TRIAL}", params={"program_hash": before["program_hash"]}).json()
        assert old["origin"] == "upload" and old["active"] is False
        assert admin.get(f"/v1/trials/{TRIAL}").json()["program_hash"] == rev["trial"]["program_hash"]
    with svc.client("match") as c:
        assert c.post("/v1/trials", json={"program": program()}).status_code == 403  # lower role
    assert verify(svc).returncode == 0


# ---- bounds and pages (issue 22, item 4) ---------------------------------------------------------
LONG = "T-LONG"


def paged(limit: int, cursor: str | None) -> dict:
    return {"limit": limit, **({"cursor": cursor} if cursor is not None else {})}


def test_a_lineage_is_bounded_and_its_history_and_flags_come_in_pages(svc):
    """Chained reviews up to api.reviews.max_reviews_per_lineage; the next is 422 and nothing stored
    changes. A review's text over max_review_chars is 413, a long flag note 422. History and flags
    are paged: the pages, joined, are the whole."""
    with svc.client("admin") as admin:
        assert admin.post("/v1/trials", json={"program": program(LONG)}).status_code == 200
    with svc.client("match") as c:
        r = c.post("/v1/match", json={"trial_id": LONG, "patient": {"patient_id": "P9", "note": NOTE}})
    first = current = r.json()["decision_id"]
    with svc.client("review") as c, svc.client("audit") as a:
        big = {**FLAG, "note": "n" * 1000, "reason": "r" * 2000}
        too_big = c.post(f"/v1/decisions/{first}/reviews", json={"changes": [big] * 4})
        assert too_big.status_code == 413 and too_big.json()["error"] == "review_too_large", too_big.text
        assert "max_review_chars" in too_big.json()["message"]
        long_note = c.post(f"/v1/decisions/{first}/reviews", json={"changes": [{**FLAG, "note": "n" * 1001}]})
        assert long_note.status_code == 422 and long_note.json()["problems"][0]["field"] == "changes.0.note"
        assert a.get(f"/v1/decisions/{first}/history").json()["total"] == 1  # nothing stored
        for i in range(6):
            flag = {**FLAG, "note": f"flag {i}"}
            r = c.post(f"/v1/decisions/{current}/reviews", json={"changes": [flag, flag]})
            assert r.status_code == 200, r.text
            current = r.json()["decision_id"]
        full = c.post(f"/v1/decisions/{current}/reviews", json={"changes": [CONFIRM]})
        assert full.status_code == 422 and full.json()["problems"][0]["field"] == "decision_id", full.text
        assert "max_reviews_per_lineage" in full.json()["message"]
        whole = a.get(f"/v1/decisions/{current}/history", params={"limit": 500}).json()
        assert whole["total"] == 7 and whole["next_cursor"] is None and not whole["superseded"]
        assert whole["entries"][0]["decision_id"] == first and whole["entries"][-1]["decision_id"] == current
        pages, cursor = [], None
        while True:
            page = a.get(f"/v1/decisions/{current}/history", params=paged(3, cursor)).json()
            pages.append(page)
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert [len(p["entries"]) for p in pages] == [3, 3, 1] and [p["offset"] for p in pages] == [0, 3, 6]
        assert [e for p in pages for e in p["entries"]] == whole["entries"]
        bad = a.get(f"/v1/decisions/{current}/history", params={"cursor": "dec_elsewhere"})
        assert bad.status_code == 422 and bad.json()["problems"][0]["field"] == "cursor"
        assert a.get(f"/v1/decisions/{current}/history", params={"limit": 0}).status_code == 422
        flags = a.get(f"/v1/trials/{LONG}/flags", params={"limit": 500}).json()
        assert [f["note"] for f in flags["flags"]] == [
            f"flag {i}" for i in reversed(range(6)) for _ in (0, 1)
        ]
        got, cursor = [], None
        while True:
            page = a.get(f"/v1/trials/{LONG}/flags", params=paged(3, cursor)).json()
            assert len(page["flags"]) in (3, 4) or page["next_cursor"] is None  # a review is never split
            got += page["flags"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert got == flags["flags"]
        # the page shows the newest entries and links the history for the rest
        page = a.get(f"/v1/decisions/{current}/page").text
        assert 'id="history"' in page and current in page and 'id="earlier"' not in page


def test_history_page_and_flags_leave_the_event_loop_free(postgres_db, scripted, tmp_path):
    """Store reads of the history, the page and the flags run off the event loop: while they wait on a
    locked table, /healthz answers (by order: it completes before any of them)."""
    import threading

    from verdict.serve.api_keys import KeyStore
    from verdict.serve.audit.postgres import SCHEMA, setup_schema

    from tests.fixtures.postgres import ADMIN_PASSWORD_ENV, PASSWORD_ENV, WRITER

    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    api = {**CONFIG, "audit_db": postgres_db.writer_url, "audit_password_env": PASSWORD_ENV}
    s = start_service(tmp_path / "pg", scripted.url, api)
    try:
        s.keys["review"] = KeyStore(s.folder / "keys.json").add("test-review", ["review"])[0]
        with s.client("admin") as admin:
            assert admin.post("/v1/trials", json={"program": program()}).status_code == 200
        did = match(s)["decision_id"]
        done: list[tuple[str, int]] = []

        def get(name, path):
            with s.client("review") as c:
                done.append((name, c.get(path).status_code))

        reads = [("history", f"/v1/decisions/{did}/history"), ("page", f"/v1/decisions/{did}/page"),
                 ("flags", f"/v1/trials/{TRIAL}/flags")]  # fmt: skip
        with postgres_db.cluster.admin(postgres_db.name) as lock:
            lock.execute("BEGIN")
            lock.execute(f"LOCK TABLE {SCHEMA}.decisions IN ACCESS EXCLUSIVE MODE")
            threads = [threading.Thread(target=get, args=r) for r in reads]
            for t in threads:
                t.start()
            waiting = 0
            for _ in range(300):  # until a read waits on the lock (a bound on the wait, not a speed claim)
                waiting = lock.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = %s",
                    (postgres_db.name,),
                ).fetchone()[0]
                if waiting:
                    break
                threading.Event().wait(0.1)
            assert waiting, "no read reached the locked table"
            with s.client(None) as probe:
                assert probe.get("/healthz").status_code == 200
            done.append(("healthz", 200))
            assert done == [("healthz", 200)], done  # every read still waits
            lock.execute("ROLLBACK")
        for t in threads:
            t.join(60)
        assert sorted(done[1:]) == [("flags", 200), ("history", 200), ("page", 200)]
    finally:
        s.stop()


# ---- the lineage in the store ------------------------------------------------------------------
def _decision(store, parent=None, decision="eligible"):
    return store.add_decision(
        created_by="k", trial_id="T1", program_hash="sha256:aa", patient_id="P1", note_hash="sha256:n",
        patient_hash="sha256:p", policy_name="prescreen", policy_version="1", engine_version="e",
        decision=decision, models={}, timings={}, artifacts={"x": 1}, note_text="note",
        parent_id=parent, lineage={"kind": "review", "parent_id": parent, "changes": []} if parent else None,
    )  # fmt: skip


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "audit.sqlite")
    from verdict.serve.audit.postgres import setup_schema

    from tests.serve.test_audit import ADMIN_PASSWORD_ENV, WRITER

    db = request.getfixturevalue("postgres_db")
    setup_schema(db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    return db.writer_url


def test_one_successor_per_decision_in_both_backends(location, monkeypatch, request):
    from verdict.serve.audit import AuditStore
    from verdict.serve.audit.store import Superseded

    if location.startswith("postgresql"):
        from tests.fixtures.postgres import PASSWORD_ENV

        store = AuditStore(location, password_env=PASSWORD_ENV)
    else:
        store = AuditStore(location)
    first = _decision(store)
    results = []

    def child():
        try:
            results.append(_decision(store, first.decision_id).decision_id)
        except Superseded as e:
            results.append(e)

    run_together(*(child for _ in range(4)))
    winners = [r for r in results if isinstance(r, str)]
    assert len(winners) == 1 and sum(isinstance(r, Superseded) for r in results) == 3
    assert store.successor(first.decision_id) == winners[0]
    assert store.decision(winners[0]).parent_id == first.decision_id
    assert [r.decision_id for r in store.current_decisions(trial_id="T1")] == winners
    assert store.verify().ok
    store.close()


def test_lineage_reads_in_both_backends(location):
    """One query each: a lineage's ids, its newest decision, rows by id, a trial's lineages by page."""
    from verdict.serve.audit import AuditStore

    from tests.fixtures.postgres import PASSWORD_ENV

    store = AuditStore(location, password_env=PASSWORD_ENV) if location.startswith("postgresql") else (
        AuditStore(location))  # fmt: skip
    chain = [_decision(store)]
    for _ in range(3):
        chain.append(_decision(store, chain[-1].decision_id))
    ids = [d.decision_id for d in chain]
    assert store.lineage_ids(ids[2]) == ids[:3] and store.lineage_ids("dec_none") == []
    assert store.lineage_head(ids[0]) == ids[-1] == store.lineage_head(ids[-1])
    assert [r.decision_id for r in store.decisions([ids[3], "dec_none", ids[1]])] == [ids[3], ids[1]]
    newest = store.lineage_changes("T1", None, 2)
    assert [r[1] for r in newest] == [ids[3], ids[2]] and newest[0][3]["parent_id"] == ids[2]
    assert [r[1] for r in store.lineage_changes("T1", newest[-1][0], 5)] == [ids[1]]
    store.close()


V2_DECISIONS = """CREATE TABLE decisions (seq INTEGER PRIMARY KEY, decision_id TEXT NOT NULL UNIQUE,
 created_at REAL NOT NULL, created_by TEXT NOT NULL, trial_id TEXT NOT NULL, program_hash TEXT NOT NULL,
 patient_id TEXT NOT NULL, note_hash TEXT NOT NULL, patient_hash TEXT NOT NULL, policy_name TEXT NOT NULL,
 policy_version TEXT NOT NULL, engine_version TEXT NOT NULL, decision TEXT NOT NULL,
 models_json TEXT NOT NULL,
 timings_json TEXT NOT NULL, artifacts_json TEXT NOT NULL, note_text TEXT, prev_hash TEXT NOT NULL,
 row_hash TEXT NOT NULL)"""


def make_schema_2_store(path) -> str:
    """A schema-2 SQLite store as the previous release wrote it (no lineage columns), with two rows."""
    from verdict.serve.audit.chain import link
    from verdict.serve.audit.sqlite import _SCHEMA, TRIGGERS
    from verdict.serve.audit.store import COLUMNS, LINEAGE_COLUMNS

    db = sqlite3.connect(path, isolation_level=None)
    schema = _SCHEMA.split("CREATE TABLE IF NOT EXISTS decisions")[0]
    for stmt in [s for s in schema.split(";") if s.strip()] + [V2_DECISIONS]:
        db.execute(stmt)
    db.execute("CREATE INDEX decisions_by_pair ON decisions (patient_id, trial_id)")
    for stmt in TRIGGERS.values():
        db.execute(stmt)
    db.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    trial = {
        "trial_id": "T1",
        "program_hash": "sha256:aa",
        "source_key": None,
        "origin": "upload",
        "parser_model": None,
        "prompt_version": None,
        "created_at": 1.0,
        "created_by": "k",
        "program_json": "{}",
        "details_json": None,
    }
    row = link("trials", trial, None)
    db.execute(
        f"INSERT INTO trials ({', '.join(COLUMNS['trials'])}) VALUES ({', '.join('?' * 13)})",
        [row[c] for c in COLUMNS["trials"]],
    )
    names = [c for c in COLUMNS["decisions"] if c not in LINEAGE_COLUMNS]
    dec = {
        "decision_id": "dec_old",
        "created_at": 2.0,
        "created_by": "k",
        "trial_id": "T1",
        "program_hash": "sha256:aa",
        "patient_id": "P1",
        "note_hash": "sha256:n",
        "patient_hash": "sha256:p",
        "policy_name": "prescreen",
        "policy_version": "1",
        "engine_version": "e",
        "decision": "eligible",
        "models_json": "{}",
        "timings_json": "{}",
        "artifacts_json": "{}",
        "note_text": "note",
    }
    drow = link("decisions", dec, (row["seq"], row["row_hash"]))
    db.execute(
        f"INSERT INTO decisions ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
        [drow[c] for c in names],
    )
    db.close()
    return drow["row_hash"]


def test_a_schema_2_store_is_verified_as_is_then_upgraded_in_place(tmp_path):
    from verdict.serve.audit import AuditStore

    path = tmp_path / "v2.sqlite"
    head = make_schema_2_store(path)
    ro = AuditStore(path, read_only=True)  # verify reads it as it is, changing nothing
    report = ro.verify()
    ro.close()
    assert report.ok and report.head == (2, head), report.problems
    store = AuditStore(path)  # a writer upgrades it: columns added, no row rewritten
    assert store.decision("dec_old").parent_id is None
    child = _decision(store, "dec_old", decision="ineligible")
    assert store.successor("dec_old") == child.decision_id
    assert store.verify(f"2:{head}").ok  # the old head is still in the chain
    store.close()
    meta = dict(sqlite3.connect(path).execute("SELECT key, value FROM meta").fetchall())
    assert meta == {"schema_version": "2", "schema_upgrade:3": "3", "schema_upgrade:4": "4"}
    again = AuditStore(path)  # reopening an upgraded store changes nothing
    assert again.count("decisions") == 2 and again.verify().ok
    again.close()


def test_a_postgres_schema_2_store_is_upgraded_by_its_owner_only(postgres_db):
    from verdict.serve.audit import AuditStore
    from verdict.serve.audit.postgres import setup_schema
    from verdict.serve.errors import ServeConfigError

    from tests.fixtures.postgres import ADMIN_PASSWORD_ENV, PASSWORD_ENV, WRITER

    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)
    store = AuditStore(postgres_db.writer_url, password_env=PASSWORD_ENV)
    first = _decision(store)
    store.close()
    with postgres_db.cluster.admin(postgres_db.name) as a:  # back to what the previous release created
        a.execute("SET search_path = verdict_audit")
        a.execute("DROP INDEX decisions_by_parent")
        a.execute("ALTER TABLE decisions DROP COLUMN parent_id, DROP COLUMN lineage_json")
        a.execute("ALTER TABLE audit_meta DISABLE TRIGGER audit_meta_append_only")
        a.execute("UPDATE audit_meta SET value = '2' WHERE key = 'schema_version'")
        a.execute("ALTER TABLE audit_meta ENABLE TRIGGER audit_meta_append_only")
    ro = AuditStore(postgres_db.writer_url, password_env=PASSWORD_ENV, read_only=True)
    assert ro.verify().ok  # verify reads schema 2 as it is
    ro.close()
    with pytest.raises(ServeConfigError, match="setup-postgres"):  # the writer role cannot alter tables
        AuditStore(postgres_db.writer_url, password_env=PASSWORD_ENV)
    setup_schema(postgres_db.admin_url, WRITER, password_env=ADMIN_PASSWORD_ENV)  # the owner upgrades
    store = AuditStore(postgres_db.writer_url, password_env=PASSWORD_ENV)
    child = _decision(store, first.decision_id)
    assert store.successor(first.decision_id) == child.decision_id and store.verify().ok
    store.close()


def test_store_notes_off_keeps_no_reviewer_evidence_text(tmp_path, scripted):
    from verdict.serve.api_keys import KeyStore

    s = start_service(tmp_path / "no-notes", scripted.url, {**CONFIG, "store_notes": False})
    try:
        s.keys["review"] = KeyStore(s.folder / "keys.json").add("test-review", ["review"])[0]
        with s.client("admin") as admin:
            assert admin.post("/v1/trials", json={"program": program()}).status_code == 200
        first = match(s)
        secret = "Creatinine 1.3 mg/dL per Dr Quorlin's lab slip"
        with s.client("review") as c:
            r = c.post(
                f"/v1/decisions/{first['decision_id']}/reviews",
                json={"changes": [{**CORRECT, "evidence": secret}]},
            )
        assert r.status_code == 200, r.text
        assert r.json()["result"]["decision"]["decision"] == "eligible"  # has_t2dm open: an assumption
    finally:
        s.stop()
    data = b"".join(p.read_bytes() for p in s.folder.glob("audit.sqlite*"))
    assert b"Quorlin" not in data and b"Creatinine 3.1" not in data


def test_a_revision_is_refused_in_its_transaction_when_the_active_version_moved(location):
    from verdict.serve.audit import AuditStore
    from verdict.serve.audit.store import Superseded
    from verdict.serve.reviews.serving import active_version_guard

    kwargs = {}
    if location.startswith("postgresql"):
        from tests.fixtures.postgres import PASSWORD_ENV

        kwargs["password_env"] = PASSWORD_ENV
    store = AuditStore(location, **kwargs)

    def add(h, origin="upload", guard=None):
        return store.add_trial(
            trial_id="T1", program_hash=h, program_json="{}", origin=origin, created_by="k", refuse_if=guard
        )

    add("sha256:v1")
    add("sha256:p2", origin="parser")  # a parser run does not move the active version
    add("sha256:v2", origin="revision", guard=active_version_guard("T1", "sha256:v1"))
    with pytest.raises(Superseded, match="sha256:v2"):
        add("sha256:v3", origin="revision", guard=active_version_guard("T1", "sha256:v1"))  # stale
    assert store.active_trial("T1").program_hash == "sha256:v2" and store.count("trials") == 3
    assert store.verify().ok
    store.close()
