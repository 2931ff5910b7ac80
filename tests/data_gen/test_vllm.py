"""The formalizer against a real vLLM CPU server (tiny student, LoRA adapters): the protocol and
structured outputs as vLLM implements them, and a whole teacher run with local students."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
import yaml
from verdict.data_gen.formalizer import Formalizer
from verdict.data_gen.formalizer.cache import CallCache
from verdict.data_gen.formalizer.client import EndpointClient, build_request
from verdict.data_gen.formalizer.endpoint_config import EndpointConfig
from verdict.data_gen.formalizer.protocol import PatientDoc

from tests.fixtures.vllm import STUDENT_MAX_TOKENS, teacher_programs, write_student_inputs

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

BOOL_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def student(server, model: str, mode: str = "vllm", **over) -> EndpointConfig:
    cfg = dict(
        name=f"student-{model}-{mode}",
        base_url=server.base_url,
        model=model,
        structured_output=mode,
        max_tokens=STUDENT_MAX_TOKENS,
        timeout_s=300,
        concurrency=2,
        max_retries=1,
    )
    cfg.update(over)
    return EndpointConfig(**cfg)


@pytest.mark.parametrize("mode", ["vllm", "json_schema"])
def test_structured_outputs_constrain_a_random_model(vllm_server, mode):
    """The untrained base model writes valid JSON only because the schema constrains decoding."""
    t = student(vllm_server, "base", mode, temperature=1.0, seed=1, max_tokens={"parser": 32})

    async def go():
        c = EndpointClient(t)
        try:
            req = build_request(t, "parser", [{"role": "user", "content": "Answer."}], BOOL_SCHEMA, "answer")
            return [await c.complete(req, carries_patient_text=False) for _ in range(3)]
        finally:
            await c.aclose()

    for comp in asyncio.run(go()):
        assert json.loads(comp.content) in ({"ok": True}, {"ok": False}), comp.content
        assert comp.prompt_tokens > 0 and comp.completion_tokens > 0 and not comp.usage_estimated


def test_value_miner_student_through_the_formalizer(vllm_server, student_records, tmp_path):
    """Every raw answer conforms to the JSON Schema sent (in both dialects); the formalizer checks
    it like a teacher's; a repeated request is served from the cache."""
    import jsonschema
    from verdict.data_gen.formalizer import core_schema, side_atoms, with_atom_enum

    programs = teacher_programs(student_records)
    p = student_records["patients"][0]
    note = PatientDoc(patient_id=p["patient_id"], text=p["note"], data_class="private")
    cache = CallCache(tmp_path / "cache.sqlite")
    passes = [
        (prog, side)
        for prog in programs.values()
        for side in ("inclusion", "exclusion")
        if side_atoms(prog, side)
    ]

    async def go(mode):
        fz = Formalizer(student(vllm_server, "value_miner", mode), cache=cache)
        try:
            return [await fz.mine_values(prog, note, side) for prog, side in passes]
        finally:
            await fz.aclose()

    accepted = 0
    for mode in ("vllm", "json_schema"):
        for (prog, side), res in zip(passes, asyncio.run(go(mode))):
            schema = with_atom_enum(core_schema("value-miner"), side_atoms(prog, side))
            for attempt in res.attempts:
                raw = cache.get(attempt.key)
                assert raw.finish_reason == "stop", raw.finish_reason
                jsonschema.validate(json.loads(raw.content), schema)  # decoding was constrained
                assert attempt.reason not in ("json", "empty", "undeclared_atom", "truncated")
            assert res.status == "accepted" or res.reason, res
            accepted += res.accepted
    assert accepted >= 1  # the memorized adapter's answers pass the evidence checks end to end
    again = asyncio.run(go("vllm"))
    assert all(a.cached for r in again for a in r.attempts)  # the cache serves students too


def test_teacher_run_with_local_students(vllm_server, student_records, tmp_path):
    inputs = write_student_inputs(tmp_path, student_records)
    teachers = {}
    for model in ("parser", "value_miner"):
        path = tmp_path / f"{model}.yaml"
        path.write_text(yaml.safe_dump(student(vllm_server, model).model_dump(mode="json")))
        teachers[model] = str(path)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "name": "local-students",
                "out_dir": str(tmp_path / "runs"),
                "cache": str(tmp_path / "runs" / "c.sqlite"),
                "teachers": {"parser": teachers["parser"], "miner": teachers["value_miner"]},
                "trials": {"path": str(inputs["trials"])},
                "patients": {"path": str(inputs["patients"]), "data_class": "private"},
            }
        )
    )
    cli = [sys.executable, "-m", "verdict", "teacher"]
    r = subprocess.run(
        [*cli, "run", "-c", str(cfg), "--no-progress"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout + r.stderr
    stats = json.loads(
        subprocess.run(
            [*cli, "stats", str(tmp_path / "runs" / "local-students"), "--json"],
            capture_output=True,
            text=True,
        ).stdout
    )
    assert stats["status"] == "complete" and stats["calls"]["paid"] > 0
    assembled, calls = stats["stages"]["parser (assembled)"], stats["stages"]["parser"]
    assert assembled["accepted"] == len(student_records["trials"])  # each trial assembled from its criteria
    n_criteria = sum(
        len(t["parsed"]["cohorts"][0]["inclusion"]) + len(t["parsed"]["cohorts"][0]["exclusion"])
        for t in student_records["trials"]
    )
    assert calls["accepted"] == n_criteria and calls["rejected"] == 0  # one call per criterion
    from verdict.core.program import TrialProgram
    from verdict.data_gen.formalizer import side_atoms
    from verdict.data_gen.records import RecordStore

    store = RecordStore(tmp_path / "runs" / "local-students" / "records.sqlite")
    programs = [TrialProgram.model_validate_json(x) for x in store.programs().values()]
    store.close()
    expected = sum(bool(side_atoms(pr, side)) for pr in programs for side in ("inclusion", "exclusion"))
    mined = sum(x["records"] for st, x in stats["stages"].items() if st != "parser")
    # every accepted program was mined: at least one record (chunk call) per side pass
    assert mined >= expected * len(student_records["patients"]) > 0
    r = subprocess.run(
        [*cli, "run", "-c", str(cfg), "--no-progress"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "0 calls paid" in r.stdout
