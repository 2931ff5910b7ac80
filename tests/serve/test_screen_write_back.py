"""`verdict screen --fhir-server URL --write-back`: the screen's ResearchSubjects written back to the
real FHIR server (tests/fixtures/fhir_server), against the real service and the scripted formalizer.

One ResearchSubject per ranked pair, readable back with its status and decision extension; a pair
screened again updates its one ResearchSubject; the service hands the ResearchSubjects to an admin
key only (403 for the others, nothing written); no flag, nothing written; a FHIR host off the egress
allowlist is refused before any request.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request

from verdict.serve.screen.research_subjects import DECISION_ID, EXT_DECISION, EXT_PAGE, PAIR

from tests.fixtures.fhir_server.data import AT, TOKEN
from tests.serve.conftest import verdict_command

# the service with the two trials registered, and SCRIPT (what the `scripted` formalizer answers)
from tests.serve.test_screen_fhir import SCRIPT, service, texts  # noqa: F401

STATUS = {"eligible": "candidate", "ineligible": "ineligible", "undetermined": "potential-candidate"}


def _cli(svc, fhir_url: str, patient: str, role: str, tmp_path, *extra: str):
    out = tmp_path / f"{patient}-{role}.json"
    out.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VERDICT_API_KEY", "VERDICT_EGRESS_ALLOW")}
    env.update({"VERDICT_API_KEY": svc.keys[role], "VERDICT_FHIR_TOKEN": TOKEN})
    args = ["screen", "--url", svc.url, "--at", AT.isoformat(), "--out", str(out)]
    args += ["--fhir-server", fhir_url, "--fhir-patient", patient, *extra]
    r = subprocess.run(
        [*verdict_command(), *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    return r, (json.loads(out.read_text()) if out.exists() else None)


def _subjects(fhir_server, patient: str) -> list[dict]:
    """The ResearchSubjects of a patient on the FHIR server, read back over its REST API."""
    query = urllib.parse.urlencode({"patient": f"Patient/{patient}", "_count": 100})
    req = urllib.request.Request(
        f"{fhir_server.base_url}/ResearchSubject?{query}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return [e["resource"] for e in json.load(r).get("entry") or []]


def _subject_requests(fhir_server) -> int:
    """FHIR requests on ResearchSubject so far (reads and writes)."""
    return sum(p.startswith("/ResearchSubject") for p in fhir_server.request_paths())


def _check(svc, body: dict, got: list[dict]) -> None:
    """One ResearchSubject per ranked row, with the row's status, decision id and links."""
    from fhir.resources.R4B.researchsubject import ResearchSubject

    assert len(got) == len(body["rows"])
    by_study = {s["study"]["identifier"]["value"]: s for s in got}
    for row in body["rows"]:
        s = by_study[row["trial_id"]]
        ResearchSubject.model_validate(s)  # valid R4 as stored
        ids = {i["system"]: i["value"] for i in s["identifier"]}
        assert ids == {DECISION_ID: row["decision_id"], PAIR: f"{row['trial_id']} {row['patient_id']}"}
        assert s["status"] == STATUS[row["decision"]]
        assert {e["url"]: e["valueUrl"] for e in s["extension"]} == {
            EXT_DECISION: svc.url + row["links"]["decision"],
            EXT_PAGE: svc.url + row["links"]["page"],
        }


def test_write_back_creates_one_subject_per_pair_and_a_second_run_updates_them(
    service,  # noqa: F811  (the imported fixture)
    fhir_server,
    tmp_path,
):
    pid = "trec-202129"
    assert _subjects(fhir_server, pid) == []
    r, first = _cli(service, fhir_server.base_url, pid, "admin", tmp_path, "--write-back")
    assert r.returncode == 0, r.stderr
    assert len(first["rows"]) == 2 and "2 created, 0 updated" in r.stderr
    got = _subjects(fhir_server, pid)
    _check(service, first, got)
    r, second = _cli(service, fhir_server.base_url, pid, "admin", tmp_path, "--write-back")
    assert r.returncode == 0, r.stderr
    assert "0 created, 2 updated" in r.stderr
    again = _subjects(fhir_server, pid)
    _check(service, second, again)  # the same two resources, now naming the newer decisions
    assert {s["id"] for s in again} == {s["id"] for s in got}
    assert {x["decision_id"] for x in second["rows"]}.isdisjoint(x["decision_id"] for x in first["rows"])


def test_only_an_admin_key_gets_the_subjects_and_without_the_flag_nothing_is_written(
    service,  # noqa: F811  (the imported fixture)
    fhir_server,
    tmp_path,
):
    pid = "trec-202124"
    before = _subject_requests(fhir_server)
    r, body = _cli(service, fhir_server.base_url, pid, "match", tmp_path, "--write-back")
    assert r.returncode == 2 and "admin role" in r.stderr and "nothing was written" in r.stderr, r.stderr
    assert body is not None and body["rows"]  # the screen itself ran and is recorded
    path = f"/v1/screenings/{body['screening_id']}/research-subjects"
    for role in ("match", "audit"):  # the service refuses, not only the CLI
        with service.client(role) as c:
            refused = c.get(path)
            assert refused.status_code == 403 and "admin" in refused.json()["message"], refused.text
    with service.client("admin") as c:
        assert c.get(path).status_code == 200
        assert c.get("/v1/screenings/scr_none/research-subjects").status_code == 404
    r, body = _cli(service, fhir_server.base_url, pid, "admin", tmp_path)  # no --write-back
    assert r.returncode == 0 and body["rows"], r.stderr
    assert _subject_requests(fhir_server) == before and _subjects(fhir_server, pid) == []


def test_write_back_needs_a_fhir_server_and_an_allowlisted_host(
    service,  # noqa: F811  (the imported fixture)
    fhir_server,
    tmp_path,
):
    before = fhir_server.request_count()
    bundle = tmp_path / "b.json"
    bundle.write_text("{}")
    env = {**os.environ, "VERDICT_API_KEY": service.keys["admin"]}
    r = subprocess.run(
        [*verdict_command(), "screen", "--url", service.url, "--at", AT.isoformat()]
        + ["--fhir-bundle", str(bundle), "--write-back"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert r.returncode == 2 and "--write-back" in r.stderr and "--fhir-server" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    r, body = _cli(
        service, "https://fhir.elsewhere.example/r4", "trec-202124", "admin", tmp_path, "--write-back"
    )
    assert r.returncode == 2 and "refused" in r.stderr and body is None, r.stderr
    assert fhir_server.request_count() == before
