"""`POST /v1/screen`: one patient against the registered trials, or one trial against patients,
ranked by formal distance (verdict.core.ranking) over the real API, with the scripted formalizer
(real HTTP) answering the value miner."""

from __future__ import annotations

import json

import pytest
from verdict.data_gen.scripted_server import Script, ScriptedServer

from tests.data_gen.teacher_data import age_atom
from tests.serve.conftest import start_service


def _bool(name):
    return {"name": name, "domain": "bool", "kind": "diagnosis", "definition": f"The patient has {name}."}


def _program(trial_id, min_age, *exclusions):
    return {
        "trial_id": trial_id,
        "atoms": [age_atom(), *[_bool(e) for e in exclusions]],
        "cohorts": [
            {
                "id": "main",
                "inclusion": [
                    {
                        "id": "inc1",
                        "text": f"age >= {min_age}",
                        "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": min_age},
                    }
                ],
                "exclusion": [{"id": f"exc{i}", "text": e, "formula": e} for i, e in enumerate(exclusions)],
            }
        ],
    }


TRIALS = [
    _program("T-MISS2", 50, "is_smoker"),  # 40-year-old smoker: two changes from eligible
    _program("T-ELIGIBLE", 18, "has_chest_pain"),  # nothing open
    _program("T-MISS1", 50, "has_chest_pain"),  # one change: age
    _program("T-CONFIRM", 18, "on_dialysis"),  # dialysis not in the note: an assumption to confirm
    _program("T-FAIL", 18, "broken_miner"),  # the miner answers no JSON for this trial (502 after a repair)
]
NOTE_40 = "A man, 40 years old, denies chest pain, current smoker."
NOTE_60 = "A woman, 60 years old, denies chest pain, never smoked."
VALUES = {
    "age_years": {"value": 40, "evidence": "40 years old"},
    "has_chest_pain": {"value": False, "evidence": "denies chest pain"},
    "is_smoker": {"value": True, "evidence": "current smoker"},
}
VALUES_60 = {
    "age_years": {"value": 60, "evidence": "60 years old"},
    "has_chest_pain": {"value": False, "evidence": "denies chest pain"},
    "is_smoker": {"value": False, "evidence": "never smoked"},
}
SCRIPT = {
    "rules": [
        {"match": {"contains": ['"broken_miner"']}, "responses": [{"fault": "malformed_content"}]},
        {"match": {"contains": ["60 years old"]}, "responses": [{"auto": "nulls", "auto_values": VALUES_60}]},
    ],
    "default": {"auto": "nulls", "auto_values": VALUES},
}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    svc = start_service(
        tmp_path_factory.mktemp("screen"),
        srv.url,
        {"formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"}},
    )
    try:
        with svc.client("admin") as admin:
            for t in TRIALS:
                r = admin.post("/v1/trials", json={"program": t})
                assert r.status_code == 200, r.text
        yield svc, srv
    finally:
        svc.stop()
        srv.stop()


def asked(srv, note: str) -> list[str]:
    """The atoms every value-miner call about this note asked for."""
    from verdict.data_gen.scripted_server import _find_atom_enum

    return [
        a
        for r in srv.requests
        if note in json.dumps(r.body)
        for a in _find_atom_enum(r.body.get("structured_outputs") or r.body.get("response_format") or {})
        or []
    ]


def test_one_patient_against_every_registered_trial_ranked_with_reasons(service):
    svc, srv = service
    with svc.client("match") as c, svc.client("audit") as a:
        r = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}})
        assert r.status_code == 200, r.text
        body = r.json()
        # the five trials declare age_years alike: its value is mined once for this note, not five times
        assert asked(srv, NOTE_40).count("age_years") == 1
        assert sorted(set(asked(srv, NOTE_40))) == [
            "age_years",
            "broken_miner",
            "has_chest_pain",
            "is_smoker",
            "on_dialysis",
        ]
        assert body["direction"] == "patient" and body["pairs"] == 5
        assert [x["trial_id"] for x in body["rows"]] == ["T-ELIGIBLE", "T-CONFIRM", "T-MISS1", "T-MISS2"]
        eligible, confirm, miss1, miss2 = body["rows"]
        assert (eligible["tier"], eligible["reason"]) == ("eligible", "eligible, nothing to confirm")
        assert confirm["tier"] == "eligible_to_confirm" and confirm["to_confirm"] == ["on_dialysis"]
        assert (miss1["tier"], miss1["distance"]) == ("near_miss", 1)
        assert miss1["would_be_eligible_if"][0].startswith("age_years: 40 -> ")
        assert (miss2["tier"], miss2["distance"]) == ("near_miss", 2)
        assert [x["rank"] for x in body["rows"]] == [1, 2, 3, 4]
        assert body["tiers"] == {"eligible": 1, "eligible_to_confirm": 1, "near_miss": 2}
        # the failing pair has its own error; everything else was decided and recorded
        assert [(f["trial_id"], f["status"]) for f in body["failures"]] == [("T-FAIL", 502)]
        for row in body["rows"]:
            rec = a.get(row["links"]["decision"])
            assert rec.status_code == 200 and rec.json()["decision"] == row["decision"]
            assert a.get(row["links"]["page"]).status_code == 200
        # the same screen again: the same order (a pure function of the decisions)
        again = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}}).json()
        assert [f["trial_id"] for f in again["failures"]] == ["T-FAIL"], again["failures"]
        assert [(x["trial_id"], x["tier"], x["distance"]) for x in again["rows"]] == [
            (x["trial_id"], x["tier"], x["distance"]) for x in body["rows"]
        ]


def test_one_trial_against_patients_and_a_filter(service):
    svc, _ = service
    with svc.client("match") as c:
        r = c.post(
            "/v1/screen",
            json={
                "trial_id": "T-MISS1",
                "patients": [{"patient_id": "P40", "note": NOTE_40}, {"patient_id": "P60", "note": NOTE_60}],
            },
        )
        assert r.status_code == 200, r.text
        assert [(x["patient_id"], x["tier"]) for x in r.json()["rows"]] == [
            ("P60", "eligible"),
            ("P40", "near_miss"),
        ]
        assert recorded_source(svc, r.json()) == {"kind": "api", "label": None}  # no source stated
        r = c.post(
            "/v1/screen",
            json={"patient": {"patient_id": "P60", "note": NOTE_60}, "trial_ids": ["T-MISS2", "T-ELIGIBLE"]},
        )
        assert [x["trial_id"] for x in r.json()["rows"]] == ["T-ELIGIBLE", "T-MISS2"]  # both eligible: by id


@pytest.mark.parametrize(
    "body, field",
    [
        ({"patient": {"patient_id": "P", "note": "x"}, "trial_id": "T-MISS1"}, "body"),
        ({"trial_id": "T-MISS1"}, "body"),
        ({"patient": {"patient_id": "P", "note": "x"}, "trial_ids": ["NO-SUCH-TRIAL"]}, "trial_ids.0"),
        ({"patient": {"patient_id": "P", "note": "x"}, "trial_ids": []}, "trial_ids"),
    ],
)
def test_bad_requests_name_the_problem(service, body, field):
    svc, _ = service
    with svc.client("match") as c:
        r = c.post("/v1/screen", json=body)
        assert r.status_code == 422, r.text
        assert field in {p["field"] for p in r.json()["problems"]}


def test_a_lower_role_cannot_screen(service):
    svc, srv = service
    n = len(srv.requests)
    with svc.client("audit") as a:
        r = a.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}})
        assert r.status_code == 403 and "match" in r.json()["message"]
    assert len(srv.requests) == n  # nothing reached the formalizer


def recorded_source(svc, body: dict) -> dict:
    """The source the screening run of a response was recorded with."""
    with svc.client("audit") as a:
        run = a.get(f"/v1/screenings/{body['screening_id']}")
    assert run.status_code == 200, run.text
    assert run.json()["decision_ids"] == [x["decision_id"] for x in body["rows"]]
    return run.json()["source"]


def _cli(args, env_extra=None, tmp=None):
    import os
    import subprocess

    from tests.serve.conftest import verdict_command

    env = {k: v for k, v in os.environ.items() if k not in ("VERDICT_API_KEY", "VERDICT_EGRESS_ALLOW")}
    env.update(env_extra or {})
    return subprocess.run(
        [*verdict_command(), "screen", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_the_cli_prints_the_ranked_screen_and_writes_it(service, tmp_path):
    svc, _ = service
    note = tmp_path / "note.txt"
    note.write_text(NOTE_40)
    out = tmp_path / "screen.json"
    r = _cli(
        ["--url", svc.url, "--patient-id", "P40", "--note", str(note), "--out", str(out)],
        {"VERDICT_API_KEY": svc.keys["match"]},
    )
    assert r.returncode == 0, r.stderr
    ranked = [line.split()[1] for line in r.stdout.splitlines()[1:-1] if line.split()[0].isdigit()]
    assert ranked == ["T-ELIGIBLE", "T-CONFIRM", "T-MISS1", "T-MISS2"]
    assert "would be eligible if: age_years: 40 -> " in r.stdout and "failed 502" in r.stdout
    body = json.loads(out.read_text())
    assert body["rows"][0]["trial_id"] == "T-ELIGIBLE"
    assert NOTE_40 not in r.stdout + r.stderr
    assert recorded_source(svc, body) == {"kind": "text", "label": None}  # note file names are not recorded


def test_the_cli_refuses_a_host_off_the_allowlist_before_sending_anything(service, tmp_path):
    svc, srv = service
    note = tmp_path / "note.txt"
    note.write_text(NOTE_40)
    r = _cli(
        ["--url", "http://10.255.255.1:9", "--patient-id", "P40", "--note", str(note)],
        {"VERDICT_API_KEY": svc.keys["match"]},
    )
    assert r.returncode == 2 and "not allowed" in r.stderr and "Nothing was sent" in r.stderr
    r = _cli(["--url", svc.url, "--patient-id", "P40", "--note", str(note)])
    assert r.returncode == 2 and "$VERDICT_API_KEY is not set" in r.stderr
    r = _cli(
        ["--url", svc.url, "--patient-id", "P40", "--note", str(note)], {"VERDICT_API_KEY": svc.keys["audit"]}
    )
    assert r.returncode == 2 and "HTTP 403" in r.stderr


def test_the_cli_screens_a_trial_against_a_patients_file_and_names_a_bad_line(service, tmp_path):
    svc, _ = service
    pats = tmp_path / "patients.jsonl"
    pats.write_text(
        json.dumps({"_id": "P40", "text": NOTE_40})
        + "\nnot json\n"
        + json.dumps({"_id": "P60", "text": NOTE_60})
        + "\n"
    )
    out = tmp_path / "screen.json"
    r = _cli(
        ["--url", svc.url, "--trial", "T-MISS1", "--patients", str(pats), "--out", str(out)],
        {"VERDICT_API_KEY": svc.keys["match"]},
    )
    assert r.returncode == 0, r.stderr
    ranked = [line.split()[2] for line in r.stdout.splitlines()[1:-1] if line.split()[0].isdigit()]
    assert ranked == ["P60", "P40"] and "patients.jsonl:2" in r.stderr and "not json" not in r.stderr
    recorded = recorded_source(svc, json.loads(out.read_text()))
    assert recorded == {"kind": "patients_file", "label": "patients.jsonl"}


# ---- the screening run in the audit store ----------------------------------------------------------
def _copy_of_store(svc, tmp_path):
    """A consistent copy of the running service's SQLite store (the backup API reads the WAL too)."""
    import sqlite3

    src, copy = sqlite3.connect(svc.folder / "audit.sqlite"), tmp_path / "copy.sqlite"
    dst = sqlite3.connect(copy)
    src.backup(dst)
    src.close()
    dst.close()
    return copy


def test_a_screen_is_recorded_as_one_run_in_the_chain(service, tmp_path):
    import sqlite3

    from verdict.serve.audit import AuditStore
    from verdict.serve.audit.sqlite import TRIGGERS_4

    from tests.serve.test_audit import verify_cli

    svc, _ = service
    source = {"kind": "fhir_server", "label": "https://fhir.site.example/r4"}
    with svc.client("match") as c, svc.client("audit") as a:
        r = c.post(
            "/v1/screen",
            json={
                "patient": {"patient_id": "P60", "note": NOTE_60},
                "source": source,
                "trial_ids": ["T-MISS2", "T-FAIL", "T-ELIGIBLE"],
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert c.get(f"/v1/screenings/{body['screening_id']}").status_code == 403  # a lower role
        rec = a.get(f"/v1/screenings/{body['screening_id']}")
        assert rec.status_code == 200, rec.text
        run = rec.json()
        first = a.get(body["rows"][0]["links"]["decision"]).json()
        unknown = a.get("/v1/screenings/scr_nosuch")
        assert unknown.status_code == 404 and "scr_nosuch" in unknown.json()["message"]
    assert (run["direction"], run["source"]) == ("patient", source)
    assert run["counts"] == {"pairs": 3, "ranked": {"eligible": 2}, "failures": 1}
    assert run["decision_ids"] == [x["decision_id"] for x in body["rows"]] and len(run["decision_ids"]) == 2
    assert run["created_by"] == first["created_by"] and run["policy"] == first["policy"]
    assert NOTE_60 not in rec.text
    # in the chain, after its pairs: verify passes, and a rewritten run is named
    ok = verify_cli("--db", str(svc.folder / "audit.sqlite"))
    assert ok.returncode == 0 and " screenings" in ok.stderr, ok.stderr
    copy = _copy_of_store(svc, tmp_path)
    db = sqlite3.connect(copy)
    (seq,) = db.execute(
        "SELECT seq FROM screenings WHERE screening_id = ?", (body["screening_id"],)
    ).fetchone()
    assert seq > max(
        db.execute("SELECT seq FROM decisions WHERE decision_id = ?", (d,)).fetchone()[0]
        for d in run["decision_ids"]
    )
    for name in TRIGGERS_4:
        db.execute(f"DROP TRIGGER {name}")
    db.execute("UPDATE screenings SET counts_json = '{}', source_kind = 'api' WHERE seq = ?", (seq,))
    db.commit()
    db.close()
    report = AuditStore(copy, read_only=True).verify()
    assert (
        f"screenings row seq {seq} ({body['screening_id']}): content does not match its row_hash"
        in report.problems[-1]
        and "trigger screenings_no_update is missing (dropped)" in report.problems
    )


def test_research_subject_links_never_come_from_the_host_header(service):
    """Issue 22.12: `Host: evil.example` gave `valueUrl: http://evil.example/...`. Without
    api.public_url the links are relative; with it, they start with it (config checked)."""
    from verdict.serve.api_config import ApiConfig

    svc, _ = service
    with svc.client("match") as c, svc.client("admin") as admin:
        r = c.post(
            "/v1/screen",
            json={"patient": {"patient_id": "P60", "note": NOTE_60}, "trial_ids": ["T-ELIGIBLE"]},
        )
        assert r.status_code == 200, r.text
        row = r.json()["rows"][0]
        got = admin.get(
            f"/v1/screenings/{r.json()['screening_id']}/research-subjects", headers={"Host": "evil.example"}
        )
    assert got.status_code == 200, got.text
    assert "evil.example" not in got.text
    (subject,) = got.json()["research_subjects"]
    assert [e["valueUrl"] for e in subject["extension"]] == [row["links"]["decision"], row["links"]["page"]]
    assert ApiConfig(public_url="https://verdict.site.example/").public_url == "https://verdict.site.example"
    with pytest.raises(ValueError, match="not an http or https base URL"):
        ApiConfig(public_url="verdict.site.example")


@pytest.mark.parametrize(
    "source, field",
    [
        ({"kind": "fhir_server", "label": "https://user:secret@fhir.example/r4"}, "source"),
        ({"kind": "fhir_server", "label": "https://fhir.example/r4?_token=x"}, "source"),
        ({"kind": "patients_file", "label": "/home/site/patients.jsonl"}, "source.label"),
        ({"kind": "fhir_ndjson", "label": "export\n2024"}, "source.label"),
        ({"kind": "api", "label": "x" * 201}, "source.label"),
        # issue 22.11b: free text (a name, a sentence) is not a source's label
        ({"kind": "api", "label": "Zyxwvut Quorlin MRN 99887766"}, "source.label"),
        ({"kind": "patients_file", "label": "Quorlin, Zyxwvut.jsonl"}, "source.label"),
        ({"kind": "fhir_server", "label": "https://fhir.example/Patient/Zyxwvut Quorlin"}, "source.label"),
        ({"kind": "email"}, "source.kind"),
    ],
)
def test_a_bad_source_is_refused_naming_it(service, source, field):
    svc, srv = service
    n = len(srv.requests)
    with svc.client("match") as c:
        r = c.post("/v1/screen", json={"patient": {"patient_id": "P60", "note": NOTE_60}, "source": source})
        assert r.status_code == 422 and field in {p["field"] for p in r.json()["problems"]}, r.text
        assert "secret" not in r.text and "Quorlin" not in r.text
    assert len(srv.requests) == n


def test_the_cli_records_a_fhir_server_by_its_base_url_only():
    from verdict.serve.screen.sources import server_label

    got = server_label("https://user:pw@fhir.site.example:8443/r4/?_count=5#x")
    assert got == "https://fhir.site.example:8443/r4"


def test_duplicate_patient_ids_are_refused_naming_them_as_match_batch_does(service):
    """Issue 22.7: a population that names a patient twice is a 422 naming the id (it was a 500),
    refused by the request model before anything is screened, as `/v1/match/batch` refuses it."""
    svc, srv = service
    n = len(srv.requests)
    twice = [{"patient_id": "P40", "note": NOTE_40}, {"patient_id": "P60", "note": NOTE_60}]
    twice += [{"patient_id": "P40", "note": NOTE_60}]
    with svc.client("match") as c:
        screened = c.post("/v1/screen", json={"trial_id": "T-MISS1", "patients": twice})
        batch = c.post("/v1/match/batch", json={"trial_ids": ["T-MISS1"], "patients": twice})
    for r in (screened, batch):
        assert r.status_code == 422, r.text
        assert r.json()["problems"] == [
            {"field": "patients", "message": "Value error, duplicate patient_id(s): P40"}
        ]
        assert NOTE_60 not in r.text
    assert len(srv.requests) == n


# ---- a site's worth of trials ------------------------------------------------------------------------
SITE_TRIALS = 2000
# four shapes for P40 (40 years old, smoker, no chest pain, dialysis not in the note), by trial number
SITE_SHAPES = [
    ((18, "has_chest_pain"), ("eligible", 0)),
    ((18, "on_dialysis"), ("eligible_to_confirm", 1)),
    ((50, "has_chest_pain"), ("near_miss", 1)),
    ((50, "is_smoker"), ("near_miss", 2)),
]


def register_site(store_path, n: int) -> None:
    """`n` registered trials, four small programs (SITE_SHAPES) under `n` ids, written to the store
    the way an upload writes them (`TrialService.upload_program`; uploading through the API is
    tested above and would spend its Z3 check `n` times). Before the service starts."""
    from verdict.core.program import TrialProgram, check_program
    from verdict.serve.audit import AuditStore

    store = AuditStore(store_path)
    try:
        for i in range(n):
            (min_age, exclusion), _ = SITE_SHAPES[i % len(SITE_SHAPES)]
            p = check_program(TrialProgram.model_validate(_program(f"S-{i:04d}", min_age, exclusion)))
            store.add_trial(
                trial_id=p.trial_id,
                program_hash=p.content_hash,
                program_json=p.model_dump_json(by_alias=True),
                origin="upload",
                created_by="loader",
            )
    finally:
        store.close()


def start_site(folder, n: int, limits: dict | None = None):
    """A service in `folder` with `n` registered trials, and the scripted formalizer it asks."""
    register_site(folder / "audit.sqlite", n)
    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    api = {
        "formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"},
        "limits": limits or {},
    }
    try:
        return start_service(folder, srv.url, api), srv
    except BaseException:
        srv.stop()
        raise


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A service with 2,000 registered trials (no more screen pairs allowed), the scripted server
    answering the miner."""
    svc, srv = start_site(tmp_path_factory.mktemp("site"), SITE_TRIALS, {"max_screen_pairs": SITE_TRIALS})
    try:
        yield svc, srv
    finally:
        svc.stop()
        srv.stop()


def test_one_patient_against_thousands_of_registered_trials(site):
    """Issue 22.1: a screen against every one of 2,000 registered trials (it was a 500 past 200): every
    pair decided and recorded, ranked in one order, every ranked decision in the run's record; past
    `limits.max_screen_pairs` a clear 422 before anything is screened."""
    svc, srv = site
    with svc.client("match") as c, svc.client("audit") as a, svc.client("admin") as admin:
        r = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}})
        assert r.status_code == 200, r.text[:2000]
        body = r.json()
        run = a.get(f"/v1/screenings/{body['screening_id']}").json()
        last = a.get(body["rows"][-1]["links"]["decision"]).json()
        # an explicit list of hundreds of the site's trials (it was capped at 200)
        some = [f"S-{i:04d}" for i in range(300)]
        listed = c.post(
            "/v1/screen",
            json={"patient": {"patient_id": "P40", "note": NOTE_40}, "trial_ids": some, "max_rows": 3},
        )
        assert listed.status_code == 200 and listed.json()["pairs"] == 300, listed.text[:500]
        # one more trial is past the limit: refused naming it, and nothing is screened
        extra = admin.post("/v1/trials", json={"program": _program("S-EXTRA", 18, "has_chest_pain")})
        assert extra.status_code == 200, extra.text
        n = len(srv.requests)
        over = c.post("/v1/screen", json={"patient": {"patient_id": "P60", "note": NOTE_60}})
    per_shape = SITE_TRIALS // len(SITE_SHAPES)
    assert body["pairs"] == SITE_TRIALS and body["failures"] == [] and body["rows_omitted"] == 0
    assert body["tiers"] == {
        "eligible": per_shape,
        "eligible_to_confirm": per_shape,
        "near_miss": 2 * per_shape,
    }
    # one order over every pair however they finished: by tier and distance (the shapes), then by id
    by_shape = [
        [f"S-{i:04d}" for i in range(k, SITE_TRIALS, len(SITE_SHAPES))] for k in range(len(SITE_SHAPES))
    ]
    assert [x["trial_id"] for x in body["rows"]] == [t for ids in by_shape for t in ids]
    assert [(x["tier"], x["distance"]) for x in body["rows"][::per_shape]] == [t for _, t in SITE_SHAPES]
    assert [x["rank"] for x in body["rows"]] == list(range(1, SITE_TRIALS + 1))
    # the run's record: every ranked decision, best first; the worst is a two-change near miss
    assert run["decision_ids"] == [x["decision_id"] for x in body["rows"]]
    assert len(set(run["decision_ids"])) == SITE_TRIALS
    assert run["counts"] == {"pairs": SITE_TRIALS, "ranked": body["tiers"], "failures": 0}
    assert (last["trial_id"], last["decision"]) == (by_shape[-1][-1], "ineligible")
    # each atom's value was mined once for this note, not once per trial
    assert sorted(asked(srv, NOTE_40)) == ["age_years", "has_chest_pain", "is_smoker", "on_dialysis"]
    assert over.status_code == 422 and over.json()["problems"][0]["field"] == "trial_ids", over.text
    assert "limits.max_screen_pairs" in over.json()["problems"][0]["message"]
    assert len(srv.requests) == n


def test_max_rows_answers_the_best_rows_and_counts_the_rest(service):
    """The answer may be cut to the best `max_rows` rows: the counts and the run's record still cover
    every pair."""
    svc, _ = service
    with svc.client("match") as c:
        r = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}, "max_rows": 2})
        assert r.status_code == 200, r.text
        bad = c.post("/v1/screen", json={"patient": {"patient_id": "P40", "note": NOTE_40}, "max_rows": 0})
    body = r.json()
    assert [x["trial_id"] for x in body["rows"]] == ["T-ELIGIBLE", "T-CONFIRM"] and body["rows_omitted"] == 2
    assert body["tiers"] == {"eligible": 1, "eligible_to_confirm": 1, "near_miss": 2} and body["pairs"] == 5
    assert [f["trial_id"] for f in body["failures"]] == ["T-FAIL"]
    with svc.client("audit") as a:
        run = a.get(f"/v1/screenings/{body['screening_id']}").json()
    assert len(run["decision_ids"]) == 4 and run["decision_ids"][:2] == [
        x["decision_id"] for x in body["rows"]
    ]
    assert bad.status_code == 422 and bad.json()["problems"][0]["field"] == "max_rows"
