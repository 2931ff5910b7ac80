"""The tiny students' SFT records: value-miner rows follow the service's bounded mining plan."""

from __future__ import annotations

import json

from verdict.core.patient import ValueMinerOutput
from verdict.data_gen.formalizer import Formalizer
from verdict.data_gen.formalizer.miner_prompt import asked_atoms
from verdict.data_gen.formalizer.mining_plan import plan_for
from verdict.data_gen.formalizer.protocol import PatientDoc
from verdict.serve.api_config import FormalizerConfig
from verdict.serve.students import STUDENT_MAX_TOKENS, miner_rows, sft_rows, teacher_programs

N = 12
SENTENCES = [
    f"Finding number {i} was documented on ward {i} after a long and careful examination." for i in range(N)
]


def records() -> dict:
    atoms = [
        {
            "name": f"finding_{i}",
            "domain": "bool",
            "kind": "diagnosis",
            "definition": f"Finding number {i} present.",
        }
        for i in range(N)
    ]
    inclusion = [{"id": f"inc{i}", "text": f"Finding {i}", "formula": f"finding_{i}"} for i in range(N)]
    parsed = {"atoms": atoms, "cohorts": [{"id": "main", "inclusion": inclusion, "exclusion": []}]}
    trial = {
        "trial_id": "NCT-BIG",
        "title": "Many findings",
        "inclusion": "...",
        "exclusion": "",
        "parsed": parsed,
    }
    facts = {f"finding_{i}": [True, SENTENCES[i]] for i in range(N)}
    patient = {"patient_id": "P9", "note": "\n\n".join(SENTENCES), "facts": facts}
    return {"trials": [trial], "patients": [patient]}


def test_miner_rows_are_chunked_and_split_as_the_service_asks():
    recs = records()
    programs = teacher_programs(recs)
    limits = FormalizerConfig(
        max_tokens=STUDENT_MAX_TOKENS, context_tokens=STUDENT_MAX_TOKENS["miner_inclusion"] + 700
    )
    rows = miner_rows(recs, programs, {"teacher": "recorded-teacher", "prompt_version": "v1"}, limits)
    fz = Formalizer(limits.endpoint("value_miner", "http://127.0.0.1:9/v1"))
    plan = plan_for(
        fz, programs["NCT-BIG"], PatientDoc(patient_id="P9", text=recs["patients"][0]["note"]), "inclusion"
    )
    assert len({c.chunk for c in plan}) > 1 and len({c.passages[0].id for c in plan}) > 1  # chunked and split
    assert [r["messages"][:-1] for r in rows] == [c.messages for c in plan]  # the service's very prompts
    assert len({r["record_id"] for r in rows}) == len(rows)
    seen: dict[str, list[bool | None]] = {}
    for r, call in zip(rows, plan):
        out = ValueMinerOutput.model_validate(json.loads(r["messages"][-1]["content"]))
        assert asked_atoms(r["messages"][:-1]) == call.atoms
        # sparse targets: true only in the passage holding the quote, left out (null) elsewhere
        held = [a for a in call.atoms if any(SENTENCES[int(a.split("_")[1])] in t for t in call.texts)]
        assert [v.atom for v in out.values] == held
        for v in out.values:
            assert v.value is True and any(v.evidence in t for t in call.texts)
            seen.setdefault(v.atom, []).append(v.value)
    assert sorted(seen) == sorted(f"finding_{i}" for i in range(N))
    assert all(vals.count(True) == 1 for vals in seen.values())  # each fact found exactly once


def test_the_student_export_prints_no_datasets_progress_bar_and_restores_the_setting(tmp_path, capfd):
    """`verdict demo` wrote a "Saving the dataset" bar per split (issue 25); the project's own lines stay."""
    from datasets.utils.logging import enable_progress_bar, is_progress_bar_enabled
    from verdict.core.configs import shipped
    from verdict.serve.students import write_student_export

    demo_records = json.loads(shipped("examples", "demo", "teacher_records.json").read_text())
    enable_progress_bar()  # as a fresh process has it (another test may have turned it off)
    write_student_export(demo_records, tmp_path / "export")
    assert "Saving the dataset" not in capfd.readouterr().err
    assert (tmp_path / "export" / "value_miner" / "dataset_dict.json").is_file()
    assert is_progress_bar_enabled()  # only inside the save


def test_chart_rows_are_the_prompts_the_service_sends_when_it_reads_the_chart_once(tmp_path):
    """The chart patient's rows (tests/fixtures/vllm.py: the tiny student learns them) are the very
    requests a formalizer that reads the chart once sends (real HTTP to the scripted server playing
    the recorded reader): the reading, then each trial side's value miner on the fact sheet."""
    import asyncio

    from verdict.data_gen.formalizer.reader import mine_chart
    from verdict.data_gen.scripted_server import Script, ScriptedServer

    from tests.data_gen.teacher_data import READER_MARK
    from tests.fixtures.vllm import CHART_OF, chart_record, load_teacher_records, student_limits, with_chart

    chart = chart_record(tmp_path)
    recs = with_chart(load_teacher_records(), chart)
    limits = student_limits()
    rows = sft_rows(recs, limits)
    p1 = next(p for p in recs["patients"] if p["patient_id"] == CHART_OF)
    quotes = [q for _, q in p1["facts"].values() if q]
    script = {
        "rules": [
            {
                "match": {"contains": [READER_MARK]},
                "responses": [{"auto": "excerpts", "auto_excerpts": quotes}],
            }
        ],
        "default": {"auto": "nulls"},
    }
    srv = ScriptedServer(Script.model_validate(script)).start()

    async def read_and_mine() -> None:
        fz = Formalizer(
            limits.endpoint(limits.value_miner_model, srv.url), prompts=limits.prompts, reading=limits.reading
        )
        try:
            for program in teacher_programs(recs).values():
                for side in ("inclusion", "exclusion"):
                    res = await mine_chart(fz, program, chart.patient_doc(), side)
                    assert res.accepted and res.chart_read.excerpts_kept == len(quotes)
        finally:
            await fz.aclose()

    try:
        asyncio.run(read_and_mine())
    finally:
        srv.stop()
    sent = [r.body["messages"] for r in srv.requests]
    reader = [r["messages"][:-1] for r in rows["reader"]]
    sheet = [r["messages"][:-1] for r in rows["value_miner"] if r["patient_id"] == chart.patient_id]
    assert len(reader) == 1 and len(sheet) == 4  # one reading; both trials x both sides on its sheet
    assert sent == reader + sheet
    assert (
        rows["value_miner"][: -len(sheet)] == sft_rows(load_teacher_records())["value_miner"]
    )  # notes: as before
