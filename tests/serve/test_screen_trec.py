"""Screening one TREC 2021 patient against all its judged trials, through the API and the CLI.

The topic is a real one (`patients_trec2021.jsonl`) and so are its judged trials' criteria
(`trials.jsonl`, `trials_judged0_only.jsonl`). Their programs come from the test teacher
(`tests.serve.programs.teacher_output`, a double of the API teacher: one chart-checkable atom per
criterion, `age_years >= N` for an age bound) and are uploaded by an admin; the scripted value
miner reads the topic's age from its text and leaves every other atom open, so trials rank by how
much is left to confirm at the visit. The answer must be ranked by the accountability artifacts
(verdict.core.ranking), every row explained, and the CLI must print the same order.
"""

from __future__ import annotations

import json
import re

import pytest
from verdict.data_gen.scripted_server import Script, ScriptedServer

from tests.serve.conftest import start_service
from tests.serve.test_screen import _cli
from tests.support import BENCHMARKS, need

TOPIC = "trec-20218"  # 46 judged trials
ORDER = ["eligible", "eligible_to_confirm", "near_miss", "ineligible", "undetermined"]


def _topic():
    from verdict.data_gen.sources import load_patients, load_trials

    need((BENCHMARKS / "pairs_trec2021.jsonl").exists(), "shared TREC 2021 data missing")
    judged = sorted(
        {
            json.loads(line)["nct_id"]
            for line in (BENCHMARKS / "pairs_trec2021.jsonl").open()
            if json.loads(line)["patient_id"] == TOPIC
        }
    )
    trials = [
        t
        for f in ("trials.jsonl", "trials_judged0_only.jsonl")
        for t in load_trials(BENCHMARKS / f, ids=judged).items
    ]
    note = load_patients(BENCHMARKS / "patients_trec2021.jsonl", ids=[TOPIC], data_class="public").items[0]
    return trials, note


def _program(trial) -> dict | None:
    """The test teacher's program for a trial, as an upload body (None: nothing chart-checkable)."""
    from verdict.core.engine import Engine
    from verdict.data_gen.formalizer.assembly import assemble
    from verdict.data_gen.formalizer.criteria import split_trial

    from tests.serve.programs import teacher_output

    criteria = split_trial(trial).criteria
    names: set[str] = set()
    outputs = {c.id: teacher_output(c, names) for c in criteria}
    asm = assemble(
        trial.trial_id, trial.title, criteria, outputs, {}, check_satisfiable=Engine().check_satisfiable
    )
    return None if asm.program is None else asm.program.model_dump(mode="json", by_alias=True)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    trials, note = _topic()
    age = re.search(r"(\d+)-year-old", note.text)
    values = {"age_years": {"value": int(age.group(1)), "evidence": age.group(0)}} if age else {}
    srv = ScriptedServer(Script.model_validate({"default": {"auto": "nulls", "auto_values": values}})).start()
    svc = start_service(
        tmp_path_factory.mktemp("screen-trec"),
        srv.url,
        {"formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"}},
    )
    registered = []
    try:
        with svc.client("admin") as admin:
            for t in trials:
                program = _program(t)
                if program is None:
                    continue
                r = admin.post("/v1/trials", json={"program": program}, timeout=120)
                assert r.status_code == 200, r.text
                registered.append(t.trial_id)
        yield svc, note, registered
    finally:
        svc.stop()
        srv.stop()


def _check_ranked(rows: list[dict]) -> None:
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    keys = [(ORDER.index(r["tier"]), r["distance"], r["trial_id"]) for r in rows]
    assert keys == sorted(keys)  # tiers, then distance, then id: deterministic
    for r in rows:
        assert r["reason"] and r["links"]["page"].endswith("/page")
        if r["tier"] == "eligible_to_confirm":
            assert len(r["to_confirm"]) == r["distance"] > 0
        if r["tier"] == "near_miss":
            assert len(r["would_be_eligible_if"]) == r["distance"] > 0


def test_one_trec_patient_against_all_its_judged_trials_through_the_api(service):
    svc, note, registered = service
    assert len(registered) >= 40  # nearly all 46 judged trials have chart-checkable criteria
    with svc.client() as c:
        r = c.post(
            "/v1/screen",
            json={"patient": {"patient_id": TOPIC, "note": note.text}, "trial_ids": registered},
            timeout=600,
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["pairs"] == len(registered) and not body["failures"]
    _check_ranked(body["rows"])
    assert sum(body["tiers"].values()) == len(registered)
    assert (
        len({(r["tier"], r["distance"]) for r in body["rows"]}) >= 3
    )  # places differ: the order says something
    print(f"\nTREC {TOPIC}: {len(registered)} trials ranked, tiers {body['tiers']}")


def test_the_cli_prints_the_same_ranking(service, tmp_path):
    svc, note, registered = service
    doc = tmp_path / "note.txt"
    doc.write_text(note.text)
    out = tmp_path / "screen.json"
    r = _cli(
        [
            "--url",
            svc.url,
            "--patient-id",
            TOPIC,
            "--note",
            str(doc),
            "--out",
            str(out),
            *[x for t in registered for x in ("--trial-id", t)],
            "--timeout",
            "600",
        ],
        {"VERDICT_API_KEY": svc.keys["match"]},
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    _check_ranked(rows)
    printed = [
        w[1]
        for w in map(str.split, r.stdout.splitlines())
        if len(w) > 1 and w[0].isdigit() and w[1].startswith("NCT")
    ]
    assert printed == [x["trial_id"] for x in rows] and len(printed) == len(registered)
    assert note.text[:60] not in r.stdout + r.stderr  # the note stays out of the terminal
