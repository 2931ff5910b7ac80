"""`verdict screen` with patients from FHIR R4 (a real FHIR server, a Bundle, a Bulk Data export)
against the real service, with the scripted formalizer (real HTTP) answering the value miner.

The FHIR path must decide as the plain-text path does for the same topics, with the atoms the coded
facts decide (labs, age at the reference date) never asked of the miner and their evidence naming the
resource (`Observation/...`, conversions shown); invalid resources are reported by id; a FHIR host off
the egress allowlist is refused before any request.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from verdict.data_gen.scripted_server import _find_atom_enum

from tests.fixtures.fhir_server.data import AT, TOKEN, topic_resources, topics, write_bundle, write_ndjson
from tests.serve.conftest import start_service, verdict_command
from tests.serve.test_screen import recorded_source

TOPICS = ["trec-20211", "trec-202124", "trec-202129", "trec-202132"]  # the last three have coded labs
CODED_ATOMS = {"age_years", "serum_creatinine", "hba1c_percent"}


def _atom(name, domain, kind, definition, unit=None):
    return {
        "name": name,
        "domain": domain,
        "kind": kind,
        "definition": definition,
        **({"unit": unit} if unit else {}),
    }


AGE = _atom("age_years", "int", "demographic", "Age in years.", "years")
CREATININE = _atom("serum_creatinine", "real", "lab_value", "Most recent serum creatinine.", "mg/dL")
HBA1C = _atom("hba1c_percent", "real", "lab_value", "Most recent HbA1c (NGSP).", "%")
T1D = _atom("has_t1d", "bool", "diagnosis", "The patient has type 1 diabetes.")


def _cmp(cid, atom, rel, rhs):
    return {
        "id": cid,
        "text": f"{atom} {rel} {rhs}",
        "formula": {"op": "cmp", "lhs": atom, "rel": rel, "rhs": rhs},
    }


TRIALS = [
    {
        "trial_id": "T-RENAL",
        "atoms": [AGE, CREATININE, T1D],
        "cohorts": [
            {
                "id": "main",
                "inclusion": [_cmp("i1", "age_years", "ge", 18), _cmp("i2", "serum_creatinine", "le", 1.5)],
                "exclusion": [{"id": "e1", "text": "type 1 diabetes", "formula": "has_t1d"}],
            }
        ],
    },
    {
        "trial_id": "T-A1C",
        "atoms": [AGE, HBA1C],
        "cohorts": [
            {
                "id": "main",
                "inclusion": [_cmp("i1", "age_years", "ge", 18)],
                "exclusion": [_cmp("e1", "hba1c_percent", "gt", 10)],
            }
        ],
    },
]


def _v(value, evidence):
    return {"value": value, "evidence": evidence}


# What the scripted miner reads in each topic's text (verbatim quotes), found by a phrase of the text.
MINED = {
    "trec-20211": ("45-year-old man with a history of anaplastic", {"age_years": _v(45, "45-year-old man")}),
    "trec-202124": (
        "55 year old man visiting",
        {
            "age_years": _v(55, "55 year old man"),
            "serum_creatinine": _v(0.5, "Creatinine: 0.5 mg/dl"),
            "has_t1d": _v(False, "otherwise healthy"),
        },
    ),
    "trec-202129": (
        "24-year-old man who has had type 1",
        {
            "age_years": _v(24, "24-year-old man"),
            "serum_creatinine": _v(0.9, "Creatinine: 0.9 mg/dL"),
            "hba1c_percent": _v(11.3, "A1c: 11.3%"),
            "has_t1d": _v(True, "type 1 diabetes"),
        },
    ),
    "trec-202132": (
        "17 year old boy",
        {
            "age_years": _v(17, "17 year old boy"),
            "serum_creatinine": _v(3.6, "Creatinine: 3.6 mg/dL"),
            "has_t1d": _v(False, "no other underlying disease"),
        },
    ),
}
SCRIPT = {
    "rules": [
        {"match": {"contains": [phrase]}, "responses": [{"auto": "nulls", "auto_values": values}]}
        for phrase, values in MINED.values()
    ],
    "default": {"auto": "nulls"},
}


@pytest.fixture(scope="module")
def texts(fhir_topics) -> dict[str, str]:
    return {t["_id"]: t["text"] for t in topics() if t["_id"] in TOPICS}


@pytest.fixture(scope="module")
def service(scripted, texts, tmp_path_factory):
    svc = start_service(
        tmp_path_factory.mktemp("screen-fhir"),
        scripted.url,
        {"formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"}},
    )
    try:
        with svc.client("admin") as admin:
            for t in TRIALS:
                r = admin.post("/v1/trials", json={"program": t})
                assert r.status_code == 200, r.text
        yield svc
    finally:
        svc.stop()


def asked(srv, text: str) -> list[str]:
    """The atoms of every value-miner request that carried this text."""
    return [
        a
        for r in srv.requests
        if text[:120] in json.dumps(r.body, ensure_ascii=False)
        for a in _find_atom_enum(r.body.get("structured_outputs") or r.body.get("response_format") or {})
        or []
    ]


def outcome(body: dict) -> dict[tuple[str, str], tuple]:
    return {(r["patient_id"], r["trial_id"]): (r["decision"], r["tier"], r["distance"]) for r in body["rows"]}


@pytest.fixture(scope="module")
def plain(service, scripted, texts):
    """The plain-text path: each topic's text as one note, screened against both trials."""
    scripted.reset()
    out = {}
    with service.client("match") as c:
        for pid in TOPICS:
            r = c.post("/v1/screen", json={"patient": {"patient_id": pid, "note": texts[pid]}})
            assert r.status_code == 200, r.text
            assert not r.json()["failures"], r.json()["failures"]
            out.update(outcome(r.json()))
    # the text path asks the miner every atom, the labs included (what the FHIR path must not do)
    assert {"serum_creatinine", "hba1c_percent", "age_years"} <= set(asked(scripted, texts["trec-202129"]))
    return out


def screen_cli(
    args: list[str], svc, tmp_path, name: str, fhir_token: str | None = TOKEN, role: str = "match"
) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`verdict screen` against the service with `role`'s key (and the FHIR token): its exit and
    its JSON output, if any."""
    out = tmp_path / f"{name}.json"
    drop = ("VERDICT_API_KEY", "VERDICT_EGRESS_ALLOW", "VERDICT_FHIR_TOKEN")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        {"VERDICT_API_KEY": svc.keys[role], **({"VERDICT_FHIR_TOKEN": fhir_token} if fhir_token else {})}
    )
    r = subprocess.run(
        [*verdict_command(), "screen", "--url", svc.url, "--at", AT.isoformat(), "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,  # the tests read the exit status
    )
    return r, (json.loads(out.read_text()) if out.exists() else None)


def _check_coded(svc, scripted, texts, body: dict, pid: str = "trec-202129") -> None:
    """(b) the coded labs and the age were not asked of the miner, the rest was; (c) the evidence names
    the Observation and shows the conversion, in the record and on the clinician page."""
    assert not set(asked(scripted, texts[pid])) & CODED_ATOMS  # none of the requests (maybe none: reused)
    row = next(r for r in body["rows"] if r["patient_id"] == pid and r["trial_id"] == "T-RENAL")
    with svc.client("audit") as a:
        rec = a.get(row["links"]["decision"]).json()
        mined = {
            v["atom"] for side in rec["artifacts"]["value_miner"].values() for v in side["output"]["values"]
        }
        assert mined == {"has_t1d"}  # what the decision took from the miner (asked now or reused)
        res = {r["atom"]: r for r in rec["artifacts"]["patient"]["resolutions"]}
        creat = res["serum_creatinine"]
        assert creat["evidence_source"] == "Observation/obs-202129-creatinine" and creat["value"] == 0.9004
        assert "0.9004 mg/dL (converted from 79.6 umol/L)" in creat["evidence"]
        assert res["age_years"]["evidence_source"] == f"Patient/{pid}"
        assert (
            rec["artifacts"]["fhir"]["coded_atoms"]["serum_creatinine"] == "Observation/obs-202129-creatinine"
        )
        page = a.get(row["links"]["page"]).text
    assert "Observation/obs-202129-creatinine" in page and "converted from 79.6 umol/L" in page


def test_fhir_server_path_decides_as_the_text_path_with_coded_labs_not_mined(
    service, scripted, plain, texts, fhir_server, tmp_path
):
    fhir = {}
    scripted.reset()
    for pid in TOPICS:
        r, body = screen_cli(
            ["--fhir-server", fhir_server.base_url, "--fhir-patient", pid], service, tmp_path, pid
        )
        assert r.returncode == 0, r.stderr
        assert body["direction"] == "patient" and not body["failures"]
        fhir.update(outcome(body))
        assert texts[pid][:40] not in r.stdout + r.stderr
        if pid == TOPICS[0]:  # the run is recorded with the server's base URL
            base = fhir_server.base_url.rstrip("/")
            assert recorded_source(service, body) == {"kind": "fhir_server", "label": base}
        if pid == "trec-202129":
            got = asked(scripted, texts[pid])
            assert "has_t1d" in got and not set(got) & CODED_ATOMS, got  # (b) counted over the requests
            _check_coded(service, scripted, texts, body)
    assert fhir == plain  # (a) same decisions, tiers and distances for every pair
    assert {d for d, _, _ in fhir.values()} >= {"eligible", "ineligible"}


def test_a_smart_authorized_fhir_server_decides_as_the_text_path(
    service, scripted, plain, texts, smart_fhir, smart_client, tmp_path
):
    # the FHIR server behind a SMART token endpoint: read with --fhir-config (SMART Backend Services)
    smart = smart_client("screen-site")
    config = tmp_path / "fhir.yaml"
    config.write_text(json.dumps({"smart": smart.model_dump(mode="json")}))
    asked_before = len(smart_fhir.token_answers)
    pid = "trec-202129"
    args = ["--fhir-server", smart_fhir.url, "--fhir-config", str(config), "--fhir-patient", pid]
    r, body = screen_cli(args, service, tmp_path, "smart", fhir_token=None)
    assert r.returncode == 0, r.stderr
    assert outcome(body) == {k: v for k, v in plain.items() if k[0] == pid}
    assert smart_fhir.token_answers[asked_before:] == [("screen-site", 200)]  # one token for the whole read
    assert recorded_source(service, body) == {"kind": "fhir_server", "label": smart_fhir.url}
    _check_coded(service, scripted, texts, body, pid)


def test_bulk_export_goes_through_the_same_checks(service, scripted, plain, texts, tmp_path):
    folder = write_ndjson(tmp_path / "export", topic_resources(TOPICS))
    scripted.reset()
    subjects = tmp_path / "subjects.ndjson"
    r, body = screen_cli(
        ["--fhir-ndjson", str(folder), "--trial", "T-RENAL", "--research-subjects", str(subjects)],
        service,
        tmp_path,
        "ndjson",
    )
    assert r.returncode == 0, r.stderr
    assert body["direction"] == "trial" and body["pairs"] == len(TOPICS)
    assert recorded_source(service, body) == {"kind": "fhir_ndjson", "label": "export"}  # the folder's name
    assert outcome(body) == {k: v for k, v in plain.items() if k[1] == "T-RENAL"}
    _check_coded(service, scripted, texts, body)
    # the results back as FHIR: one valid ResearchSubject per ranked pair, pointing to its decision
    from fhir.resources.R4B.researchsubject import ResearchSubject

    got = [ResearchSubject.model_validate_json(line) for line in subjects.read_text().splitlines()]
    by_patient = {s.individual.reference: s for s in got}
    assert len(got) == len(body["rows"]) == len(TOPICS)
    for row in body["rows"]:
        s = by_patient[f"Patient/{row['patient_id']}"]
        assert (s.study.identifier.value, s.identifier[0].value) == ("T-RENAL", row["decision_id"])
        assert s.status == ("ineligible" if row["decision"] == "ineligible" else "candidate")
        assert [e.valueUrl for e in s.extension] == [
            service.url + row["links"]["decision"],
            service.url + row["links"]["page"],
        ]
    assert {s.status for s in got} == {"candidate", "ineligible"}


def test_an_invalid_resource_is_reported_by_id_and_the_others_go_on(service, tmp_path):
    bad = {
        "resourceType": "Observation",
        "id": "bad-1",
        "status": "final",
        "effectiveDateTime": "2024-02-30",
        "code": {"text": "SECRET-CONTENT-XYZ"},
        "subject": {"reference": "Patient/trec-202124"},
        "valueQuantity": {"value": [7, 7], "unit": "mg/dL"},
    }
    bundle = write_bundle(tmp_path / "b.json", [*topic_resources(["trec-202124", "trec-202129"]), bad])
    r, body = screen_cli(["--fhir-bundle", str(bundle), "--trial", "T-RENAL"], service, tmp_path, "bundle")
    assert r.returncode == 0, r.stderr
    assert (
        "Observation/bad-1: effectiveDateTime" in r.stderr and "Observation/bad-1: valueQuantity" in r.stderr
    )
    assert "2024-02-30" not in r.stderr + r.stdout and "SECRET-CONTENT-XYZ" not in r.stderr + r.stdout
    assert sorted(x["patient_id"] for x in body["rows"]) == ["trec-202124", "trec-202129"]
    assert recorded_source(service, body) == {"kind": "fhir_bundle", "label": "b.json"}


def test_a_fhir_host_off_the_allowlist_is_refused_before_any_request(
    service, scripted, fhir_server, tmp_path
):
    before, asked_before = fhir_server.request_count(), len(scripted.requests)
    for url in ("http://10.255.255.1:9/fhir", "https://fhir.elsewhere.example/r4"):
        r, body = screen_cli(
            ["--fhir-server", url, "--fhir-patient", "trec-202124"], service, tmp_path, "refused"
        )
        assert r.returncode == 2 and "refused" in r.stderr and body is None, r.stderr
    assert fhir_server.request_count() == before and len(scripted.requests) == asked_before


def test_fhir_patient_input_is_checked(service, texts, tmp_path):
    from verdict.data_gen.fhir.sources import load_source

    path = write_bundle(tmp_path / "one.json", topic_resources(["trec-202124"]))
    rec = load_source(str(path), AT).records[0].model_dump(mode="json")
    cases = [
        ({"patient_id": "trec-202124", "fhir": rec, "note": "x"}, "exactly one of"),
        ({"patient_id": "someone-else", "fhir": rec}, "must equal"),
        ({"patient_id": "trec-202124", "fhir": {**rec, "age_years": 30}}, "do not match"),
        ({"patient_id": "trec-202124", "fhir": {**rec, "documents": []}}, "no DocumentReference"),
        (  # an implausible reference date (issue 22.10)
            {"patient_id": "trec-202124", "fhir": {**rec, "reference_date": "9999-12-31"}},
            "`fhir.reference_date` is more than 366 days after today",
        ),
    ]
    with service.client("match") as c:
        for patient, message in cases:
            r = c.post("/v1/screen", json={"patient": patient})
            assert r.status_code == 422 and message in r.text, r.text
            assert texts["trec-202124"][:40] not in r.text
