"""Serving behaviour that needs a formalizer answering on cue: the project's scripted
OpenAI-compatible server (data_gen/scripted_server.py, real HTTP) stands in for the students where a
test needs a chosen output, a delay or a failure. The happy path with the real vLLM students is in
test_app.py.
"""

from __future__ import annotations

import json
import time

import pytest
from verdict.data_gen.scripted_server import ScriptedServer

from tests.data_gen.teacher_data import age_atom
from tests.serve.conftest import CHROMIUM, launch_chromium, start_service
from tests.serve.programs import fermat
from tests.support import need, run_together

PAIN = {"name": "has_chest_pain", "domain": "bool", "kind": "diagnosis", "definition": "Has chest pain."}
# what the scripted parser answers, per criterion (criterion_parser@v1): any inclusion criterion is
# "adults", any exclusion criterion "chest pain"
INCLUSION = {
    "in_scope": True,
    "atoms": [age_atom()],
    "formula": {"op": "cmp", "lhs": "age_years", "rel": "ge", "rhs": 18},
}
EXCLUSION = {"in_scope": True, "atoms": [PAIN], "formula": "has_chest_pain"}
XSS_NOTE = (
    "40 years old. <script>document.title='pwned'</script> Reports <b>chest pain</b> & "
    "<img src=x onerror=alert(1)>."
)
INC_ATOMS = '"name": "age_years"'
EXC_ATOMS = '"name": "has_chest_pain"'


def values(*items) -> dict:
    return {"content": {"values": [{"atom": a, "value": v, "evidence": e} for a, v, e in items]}}


SCRIPT = {
    "rules": [
        # the markup note: evidence quotes that are markup themselves
        {
            "match": {"contains": ["<script>", INC_ATOMS]},
            "responses": [values(("age_years", 40, "40 years old"))],
        },
        {
            "match": {"contains": ["<script>", EXC_ATOMS]},
            "responses": [values(("has_chest_pain", True, "<b>chest pain</b>"))],
        },
        # a hard program for the solver: w observed, the rest open (whichever atom chunk asks for w)
        {
            "match": {"contains": ["w is zero"]},
            "responses": [{"auto": "nulls", "auto_values": {"w": {"value": 0, "evidence": "w is zero"}}}],
        },
        # the first answer quotes nothing from the note ("fifty"); the repair (which carries that
        # answer back) gets it right
        {
            "match": {"contains": ["needs a repair", INC_ATOMS, "fifty"]},
            "responses": [values(("age_years", 50, "50 years"))],
        },
        {
            "match": {"contains": ["needs a repair", INC_ATOMS]},
            "responses": [values(("age_years", 50, "fifty"))],
        },
        {
            "match": {"contains": ["never right", INC_ATOMS]},
            "responses": [values(("age_years", 50, "never right, at 50 years of age with a long quote"))],
        },
        {"match": {"contains": ["Patient note"]}, "responses": [{"auto": "nulls", "latency_s": 0.3}]},
        {
            "match": {"contains": ["Exclusion criterion:\n"]},
            "responses": [{"content": EXCLUSION, "latency_s": 0.5}],
        },
    ],
    "default": {"content": INCLUSION, "latency_s": 0.5},
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory, scripted):
    s = start_service(
        tmp_path_factory.mktemp("scripted-service"),
        scripted.url,
        {
            # staged mining on: the page test below sees an atom left unasked
            "formalizer": {
                "parser_model": "scripted",
                "value_miner_model": "scripted",
                "staged_mining": True,
            },
            "solver_timeout_ms": 300,
            "limits": {"batch_concurrency": 2, "max_batch_pairs": 12},
        },
    )
    yield s
    s.stop()


def register(c, criteria: str, trial_id: str = "T-SCRIPTED") -> dict:
    """A trial with `criteria` as its inclusion criterion and 'Chest pain' as its exclusion one."""
    r = c.post(
        "/v1/trials", json={"text": {"trial_id": trial_id, "inclusion": criteria, "exclusion": "Chest pain"}}
    )
    assert r.status_code == 200, r.text
    return r.json()


def parser_calls(srv: ScriptedServer) -> int:
    return sum(1 for r in srv.requests if "Patient note" not in json.dumps(r.body))


def test_concurrent_requests_for_a_new_trial_parse_it_once(svc, scripted):
    before = parser_calls(scripted)
    results, errors = [], []

    def post():
        with svc.client() as c:
            try:
                results.append(register(c, "Adults without chest pain. (single-flight test)", "T-ONCE"))
            except AssertionError as e:
                errors.append(e)

    run_together(*(post for _ in range(8)))
    assert not errors and len(results) == 8
    assert parser_calls(scripted) - before == 2  # one model call per criterion for eight requests
    assert sum(not r["cached"] for r in results) == 1 and len({r["program_hash"] for r in results}) == 1


def test_solver_timeout_gives_undetermined_with_the_reason(svc):
    program = fermat("T-HARD")
    with svc.client("admin") as admin:
        assert admin.post("/v1/trials", json={"program": program}).status_code == 200
        r = admin.post(
            "/v1/match", json={"trial_id": "T-HARD", "patient": {"patient_id": "P-W", "note": "w is zero."}}
        )
    assert r.status_code == 200, r.text
    d = r.json()["decision"]
    assert d["decision"] == "undetermined" and "solver limit" in d["reason"] and "300 ms" in d["reason"]
    assert "Reason: solver limit" in r.json()["rationale_markdown"]


def test_one_repair_then_accepted_or_502(svc):
    with svc.client() as c, svc.client("audit") as a:
        register(c, "Adults. (repair test)", "T-REPAIR")
        ok = c.post(
            "/v1/match",
            json={
                "trial_id": "T-REPAIR",
                "patient": {"patient_id": "P-R", "note": "needs a repair: 50 years"},
            },
        )
        assert ok.status_code == 200 and ok.json()["patient"]["resolutions"][0]["value"] == 50
        bad = c.post(
            "/v1/match",
            json={
                "trial_id": "T-REPAIR",
                "patient": {"patient_id": "P-N", "note": "never right, at 50 years of age"},
            },
        )
        assert bad.status_code == 502 and bad.json()["error"] == "formalizer_output_invalid"
        probs = bad.json()["problems"]
        assert probs and {p["field"] for p in probs} == {"miner_inclusion"}
        assert "never right" not in bad.text  # the note is not quoted back
        metrics = a.get("/metrics").text
    assert 'verdict_formalizer_repairs_total{outcome="accepted",stage="miner_inclusion"} 1.0' in metrics
    assert 'verdict_formalizer_repairs_total{outcome="rejected",stage="miner_inclusion"} 1.0' in metrics


def test_batch_streams_with_bounded_concurrency(svc, scripted):
    with svc.client() as c:
        register(c, "Adults. (batch test)", "T-BATCH")
        patients = [{"patient_id": f"B{i}", "note": f"Patient {i}, no findings."} for i in range(6)]
        scripted.reset()
        t0, arrivals = time.monotonic(), []
        with c.stream("POST", "/v1/match/batch", json={"patients": patients, "trial_ids": ["T-BATCH"]}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line:
                    arrivals.append(time.monotonic() - t0)
                    assert json.loads(line)["status"] == 200
        assert len(arrivals) == 6
        # two pairs at a time, each with its two value-miner passes in parallel
        assert 2 <= scripted.peak_in_flight <= 4
        assert arrivals[-1] - arrivals[0] > 0.4  # results came as they finished, not all at the end
        r = c.post(
            "/v1/match/batch", json={"patients": patients, "trial_ids": ["T-BATCH", "T-ONCE", "T-REPAIR"]}
        )
        assert r.status_code == 422 and "limit is 12" in r.text  # 6 x 3 pairs over the configured limit
        dup = c.post("/v1/match/batch", json={"patients": patients[:1] * 2, "trial_ids": ["T-BATCH"]})
        assert dup.status_code == 422 and "duplicate patient_id" in dup.text


def test_clinicaltrials_gov_study_json(svc):
    study = {
        "protocolSection": {
            "identificationModule": {"nctId": "NCT09999999", "briefTitle": "A study"},
            "eligibilityModule": {
                "eligibilityCriteria": "Inclusion Criteria:\n* Adults\nExclusion Criteria:\n* Pain"
            },
        }
    }
    with svc.client() as c:
        r = c.post("/v1/trials", json={"ctgov_study": study})
    assert r.status_code == 200, r.text
    assert r.json()["trial_id"] == "NCT09999999" and r.json()["program"]["title"] == "A study"


def test_markup_in_a_note_stays_text_in_a_real_browser(svc):
    need(CHROMIUM.exists(), "Chromium missing: apt-get install -y chromium")
    playwright = pytest.importorskip("playwright.sync_api")
    with svc.client() as c:
        register(c, "Adults without chest pain. (page test)", "T-PAGE")
        m = c.post(
            "/v1/match", json={"trial_id": "T-PAGE", "patient": {"patient_id": "P-X", "note": XSS_NOTE}}
        )
    assert m.status_code == 200, m.text
    assert m.json()["decision"]["decision"] == "ineligible"
    with playwright.sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            page = browser.new_context(extra_http_headers={"X-API-Key": svc.keys["audit"]}).new_page()
            dialogs = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            assert page.goto(svc.url + m.json()["links"]["page"]).status == 200
            page.wait_for_timeout(300)
            assert "pwned" not in page.title() and not dialogs
            assert page.locator("#note script, #note img, #note b").count() == 0
            assert page.locator("#note").inner_text().strip() == XSS_NOTE
            assert [
                page.locator("mark").nth(i).inner_text() for i in range(page.locator("mark").count())
            ] == ["<b>chest pain</b>"]  # staged mining: the exclusion settled it, the age was not asked
            assert "not asked" in page.locator("body").inner_text()
            assert page.locator("#decision").inner_text().lower() == "ineligible"
            assert "chest pain" in page.locator("#change").inner_text().lower()
        finally:
            browser.close()


def test_parsed_programs_are_checked_by_the_services_own_solver_pool(tmp_path, scripted):
    """The parser's checks run in the service's solver pool (its solver_timeout_ms), as its
    decisions do; the core's hidden default engine takes no part."""
    import asyncio

    import verdict.core.engine as core_engine
    from verdict.serve.api_config import ApiConfig
    from verdict.serve.audit import AuditStore
    from verdict.serve.matching.protocol import MatchRequest
    from verdict.serve.protocol import PatientInput
    from verdict.serve.services import Services
    from verdict.serve.trials.protocol import TrialText
    from verdict.serve.trials.serving import trial_doc

    default = core_engine._default_engine
    default_cached = set(default._cache) if default is not None else None
    api = ApiConfig.model_validate(
        {
            "formalizer": {"parser_model": "scripted", "value_miner_model": "scripted"},
            "solver_timeout_ms": 321,
            "audit_db": str(tmp_path / "audit.sqlite"),
        }
    )
    service = Services(api, scripted.url, audit=AuditStore(api.audit_db, store_notes=False))

    async def parse_and_match():
        try:
            text = TrialText(trial_id="T-ENGINE", inclusion="Adults (engine test)", exclusion="Chest pain")
            row, _ = await service.trials.parsed_trial(trial_doc(text), "test")
            checked = service.engine.stats().answered
            patient = PatientInput(patient_id="P1", note="40 years old.")
            res = await service.matching.match(
                MatchRequest(trial_id="T-ENGINE", program_hash=row.program_hash, patient=patient), "test"
            )
            return checked, res
        finally:
            await service.aclose()
            service.audit.close()

    checked, res = asyncio.run(parse_and_match())
    f = service.formalizers
    assert f.parser.engine is service.engine and f.miner.engine is service.engine
    assert service.engine.timeout_ms == 321
    assert checked >= 2  # the criterion and the assembled program, checked in the pool at parse time
    assert service.engine.stats().answered == checked + 1  # ... and the decision made there too
    assert service.engine.stats().pids == ()  # closed with the service
    assert res.decision.decision in ("eligible", "ineligible", "undetermined")
    after = core_engine._default_engine  # the core's hidden default engine took no part
    assert (set(after._cache) if after is not None else None) == default_cached
