"""Issue 22 item 2: hard solver work never makes a short decision wait. Real HTTP against a real
`verdict serve api` (its solver pool: real worker processes, real Z3) in front of the scripted
formalizer. Asserted by order: the trivial match completes while the hard revisions still run."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from verdict.serve.api_keys import KeyStore

from tests.core.test_solver_pool import alive
from tests.serve.conftest import start_service
from tests.serve.programs import cubes, fermat, program

SCRIPT = {
    "rules": [
        {
            "match": {"contains": ["w is zero", '"name": "w"']},
            "responses": [
                {
                    "content": {
                        "values": [
                            {"atom": "w", "value": 0, "evidence": "w is zero"},
                            *({"atom": a, "value": None, "evidence": ""} for a in "xyz"),
                        ]
                    }
                }
            ],
        },
        {"match": {"contains": ["Patient note"]}, "responses": [{"auto": "nulls"}]},
    ]
}
FORMALIZER = {
    "parser_model": "scripted",
    "value_miner_model": "scripted",
    # room for every atom of a side in one call (the scripted answers cover a whole side)
    "max_tokens": {"parser": 2048, "miner_inclusion": 1024, "miner_exclusion": 1024},
}


def started(tmp_path, scripted, api: dict):
    s = start_service(tmp_path, scripted.url, {"formalizer": FORMALIZER, **api})
    s.keys["trial_owner"] = KeyStore(s.folder / "keys.json").add("test-owner", ["trial_owner"])[0]
    with s.client("admin") as admin:
        for trial in (program("T-EASY", "age_years"), program("T-HARD", "age_years"), fermat("T-FERMAT")):
            assert admin.post("/v1/trials", json={"program": trial}).status_code == 200
    return s


def trivial_match(s) -> httpx.Response:
    with s.client() as c:
        return c.post(
            "/v1/match", json={"trial_id": "T-EASY", "patient": {"patient_id": "P1", "note": "Patient note."}}
        )


def solver_metric(s, name: str, **labels: str) -> float:
    with s.client("audit") as a:
        text = a.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    m = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def jobs_in_pool(s) -> float:
    return sum(
        solver_metric(s, "verdict_solver_jobs", lane=lane, state=state)
        for lane in ("short", "hard")
        for state in ("running", "queued")
    )


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc: the pool's workers are its fork server's children)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        todo += kids
    return found


def test_a_trivial_match_completes_while_four_hard_revisions_run(tmp_path, scripted):
    # Z3's limit (120 s) is far longer than the test: the revisions are in flight throughout.
    s = started(
        tmp_path, scripted, {"solver_timeout_ms": 120_000, "solver_pool": {"workers": 2, "hard_workers": 2}}
    )
    done: list[int] = []

    def revise():
        with s.client("trial_owner", timeout=600) as o:
            try:
                r = o.post(
                    "/v1/trials/T-HARD/revisions", json={"program": cubes("T-HARD", 1), "reason": "hard"}
                )
                done.append(r.status_code)
            except httpx.HTTPError:  # the service stopped under it at the end of the test
                done.append(-1)

    threads = [threading.Thread(target=revise, daemon=True) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60  # stops a broken test only
        while jobs_in_pool(s) < 4:
            assert time.monotonic() < deadline, "the hard revisions never reached the solver pool"
            time.sleep(0.05)
        r = trivial_match(s)
        assert r.status_code == 200, r.text
        assert r.json()["decision"]["decision"] in ("eligible", "ineligible")
        assert not done and jobs_in_pool(s) == 4  # every hard revision still runs
        assert solver_metric(s, "verdict_solver_jobs", lane="hard", state="running") == 2  # its own lane
        workers = descendants(s.process.pid)
        assert len(workers) >= 4  # the fork server, its resource tracker, the solver processes
    finally:
        s.process.kill()  # killed outright: no graceful end, no pool.close()
        s.process.wait(timeout=30)
        for t in threads:
            t.join(timeout=30)
    deadline = time.monotonic() + 30
    while [p for p in workers if alive(p)]:  # each ends with the service: none is left running
        assert time.monotonic() < deadline, [p for p in workers if alive(p)]
        time.sleep(0.05)


def test_a_solve_past_the_time_limit_gets_the_timeout_answer_and_a_new_worker(tmp_path, scripted):
    # Z3's own limit (60 s) is never reached: the pool's time limit (1 s) ends the solves, as it
    # does when Z3 does not honour its timeout.
    s = started(
        tmp_path, scripted, {"solver_timeout_ms": 60_000, "solver_pool": {"workers": 1, "time_limit_s": 1}}
    )
    try:
        with s.client() as c:
            r = c.post(
                "/v1/match",
                json={"trial_id": "T-FERMAT", "patient": {"patient_id": "P-W", "note": "w is zero."}},
            )
        assert r.status_code == 200, r.text
        d = r.json()["decision"]
        assert d["decision"] == "undetermined"
        assert d["reason"] == "solver limit while deciding: the solve was stopped after 1 s"
        with s.client("trial_owner") as o:
            r = o.post("/v1/trials/T-HARD/revisions", json={"program": cubes("T-HARD", 1), "reason": "hard"})
        assert r.status_code == 422, r.text
        assert "satisfiability unknown within 60000 ms (the solve was stopped after 1 s)" in r.text
        assert solver_metric(s, "verdict_solver_events_total", event="timed_out") == 2
        assert trivial_match(s).status_code == 200  # a fresh worker answers
        assert solver_metric(s, "verdict_solver_events_total", event="crashed") == 0
    finally:
        s.stop()


@pytest.fixture(scope="module")
def scripted():
    from verdict.data_gen.scripted_server import Script, ScriptedServer

    srv = ScriptedServer(Script.model_validate(SCRIPT)).start()
    yield srv
    srv.stop()
