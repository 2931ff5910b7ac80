"""The site fine-tune of docs/train.md, end to end with the tiny student (issue 12): review ->
export -> fine-tune -> the student gives the reviewer's value.

1. The session student (tests/fixtures/vllm.py) mines a demo patient through a real `verdict serve
   api` in front of the real vLLM CPU server (guided decoding, the service's own prompt): the
   decision lands in the service's audit store with the student's answer.
2. A reviewer corrects one of its values through `POST /v1/decisions/{id}/reviews`.
3. `verdict serve export-reviews AUDIT_DB` makes the review a private SFT record.
4. configs/train/site_value_miner.yaml, the real recipe file, run from a site folder laid out as it
   names (data/sft, data/site-reviews, runs/students/value_miner/adapter): it continues the session
   adapter on the public set mixed with the review records at the recipe's weights. Only what a
   tiny model on 2 CPU cores needs is overridden (base model, learning rate, batch, device).
5. `verdict train eval` (verdict.train.eval.evaluate, greedy transformers decoding) of the fine-tuned run on
   its training sets: the reviewed prompt now gives the corrected value, and the other public
   records are still reproduced (forgetting check).

The figures of the closing note are printed (`pytest -s`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tests.serve.conftest import start_service, verdict_command
from tests.support import REPO

RECIPE = REPO / "configs" / "train" / "site_value_miner.yaml"
TRIAL, PATIENT, ATOM = "NCT-CKD-02", "P2", "on_dialysis"
# The note does not say "dialysis"; the student (like its teacher) answers unknown. The reviewer
# reads the normal creatinine in the note as "not on dialysis" and quotes it verbatim (the export
# refuses evidence that is not in the note).
EVIDENCE = "Creatinine 0.8 mg/dL"
CORRECTION = {
    "type": "correct",
    "atom": ATOM,
    "value": False,
    "evidence": EVIDENCE,
    "reason": "creatinine 0.8 mg/dL is a normal kidney function: not on dialysis (chart)",
}
# What a tiny random Qwen2 on 2 CPU cores needs instead of the 7B settings (lr 1e-4, batch 2 x 8,
# bf16, 2 epochs): the weights, datasets and init_adapter are the recipe's. Measured: lr 1e-3 or
# more makes the student forget public records (it copies the new quote's digits into other
# creatinine quotes); at 5e-4, 12 epochs learned the correction on one machine and not on another
# (CPU numerics differ), 16 and 20 learned it for seeds 0, 1 and 2: 20 epochs (40 steps) for margin.
MIX = [("public", 0.5), ("site-reviews", 4)]  # the recipe's datasets: (name, weight)
TINY = ["lr=5e-4", "epochs=20", "batch_size=8", "grad_accum=1", "bf16=false", "device=cpu",
        "gradient_checkpointing=false", "warmup_ratio=0", "logging_steps=1", "save_steps=1000"]  # fmt: skip


def miner_values(audit_db, decision_id: str, side: str) -> dict[str, dict]:
    """The value miner's answer as the service stored it (atom -> {value, evidence})."""
    from verdict.serve.audit.store import AuditStore

    audit = AuditStore(audit_db, read_only=True)
    try:
        row = audit.decision(decision_id)
    finally:
        audit.close()
    return answer(json.dumps(row.artifacts["value_miner"][f"miner_{side}"]["output"]))


def answer(content: str) -> dict[str, dict]:
    """atom -> its value line; the sparse miner (prompt v2) leaves null atoms out: they read as null."""
    found = {v["atom"]: v for v in json.loads(content)["values"]}
    return {ATOM: {"atom": ATOM, "value": None}, **found}


def test_the_site_fine_tune_learns_a_reviewed_correction(
    tmp_path,
    monkeypatch,
    student_records,
    student_base_dir,
    student_export_dir,
    student_adapters,
    vllm_server,
):
    pytest.importorskip("trl")
    from verdict.core.configs import find_config
    from verdict.serve.api_keys import KeyStore
    from verdict.train import sft_data
    from verdict.train.eval import evaluate, read_predictions
    from verdict.train.eval_config import EvalConfig
    from verdict.train.run_dir import RunDir
    from verdict.train.sft_config import load_train_config
    from verdict.train.sft_trainer import train

    trial = next(t for t in student_records["trials"] if t["trial_id"] == TRIAL)
    patient = next(p for p in student_records["patients"] if p["patient_id"] == PATIENT)
    assert EVIDENCE in patient["note"]

    # 1-2. the student's answer through the service, then the reviewer's correction
    svc = start_service(tmp_path / "service", vllm_server.base_url)
    try:
        svc.keys["review"] = KeyStore(svc.folder / "keys.json").add("test-review", ["review"])[0]
        with svc.client("admin") as a:
            program = {**trial["parsed"], "trial_id": TRIAL, "title": trial["title"]}
            assert a.post("/v1/trials", json={"program": program}).status_code == 200
        with svc.client("match") as c:
            pair = {"trial_id": TRIAL, "patient": {"patient_id": PATIENT, "note": patient["note"]}}
            r = c.post("/v1/match", json=pair)
        assert r.status_code == 200, r.text
        first = r.json()
        with svc.client("review") as c:
            r = c.post(f"/v1/decisions/{first['decision_id']}/reviews", json={"changes": [CORRECTION]})
        assert r.status_code == 200, r.text
        reviewed = {x["atom"]: x for x in r.json()["result"]["patient"]["resolutions"]}
    finally:
        svc.stop()
    audit_db = svc.folder / "audit.sqlite"
    before = miner_values(audit_db, first["decision_id"], "exclusion")[ATOM]
    assert before["value"] is not CORRECTION["value"]  # the student got it wrong: the test can fail
    assert (reviewed[ATOM]["value"], reviewed[ATOM]["evidence_source"]) == (False, "reviewer")

    # 3. the review as site training data, in the site folder the recipe names
    site = tmp_path / "site"
    (site / "data" / "sft").mkdir(parents=True)
    (site / "data" / "sft" / "value_miner").symlink_to(student_export_dir / "value_miner")
    (site / "runs" / "students" / "value_miner").mkdir(parents=True)
    (site / "runs" / "students" / "value_miner" / "adapter").symlink_to(student_adapters["value_miner"])
    out = site / "data" / "site-reviews"
    r = subprocess.run(
        [*verdict_command(), "serve", "export-reviews", str(audit_db),
         "--serve-config", str(svc.folder / "serve.yaml"), "--out", str(out)],
        check=False, capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    review_rows = [json.loads(x) for x in (out / "value_miner" / "train.jsonl").read_text().splitlines()]
    assert review_rows and all(x["patient_id"] == PATIENT and x["trial_id"] == TRIAL for x in review_rows)
    reviewed_row = next(x for x in review_rows if ATOM in answer(x["messages"][-1]["content"]))
    corrected = {"atom": ATOM, "value": False, "evidence": EVIDENCE}
    assert answer(reviewed_row["messages"][-1]["content"])[ATOM] == corrected
    prov = json.loads(reviewed_row["provenance"])
    assert prov["data_class"] == "private" and prov["reviewer_roles"] == ["review"]
    key_id = svc.keys["review"].split("_")[1]
    assert key_id not in json.dumps(reviewed_row) and "test-review" not in json.dumps(reviewed_row)
    # the prompt is the one the student was trained on for this pair (the service's plan)
    public_file = student_export_dir / "value_miner" / "train.jsonl"
    public = [json.loads(x) for x in public_file.read_text().splitlines()]
    old = next(x for x in public if x["messages"][:-1] == reviewed_row["messages"][:-1])
    assert answer(old["messages"][-1]["content"])[ATOM]["value"] == before["value"]

    # 4. the recipe, from the site folder
    monkeypatch.chdir(site)
    cfg = load_train_config(find_config("train", str(RECIPE)), [f"base_model={student_base_dir}", *TINY])
    assert cfg.init_adapter and [(d.name, d.weight) for d in cfg.datasets] == MIX
    t0 = time.perf_counter()
    result = train(cfg, progress=lambda m: None)
    train_s = time.perf_counter() - t0
    assert result.status == "completed"
    ran = RunDir(result.run_dir).read_config()  # the run records what it continued and mixed
    assert ran.init_adapter == str(student_adapters["value_miner"].resolve())
    assert [(d.name, d.weight) for d in ran.datasets] == MIX

    # 5. the fine-tuned student on its training sets (public, site-reviews), and the session student
    # before it on the same public records: "forgotten" is measured against what it reproduced then
    eval_cfg = EvalConfig(max_new_tokens=256, device="cpu", dtype="float32")
    t0 = time.perf_counter()
    reports = evaluate(result.run_dir, "train", eval_cfg, progress=lambda m: None)
    eval_s = time.perf_counter() - t0
    by_label = {rep["dataset"]: rep for rep in reports}
    preds = read_predictions(RunDir(result.run_dir).eval_dir("site-reviews", "train"))
    after = answer(preds[reviewed_row["record_id"]].output)[ATOM]
    public_after = read_predictions(RunDir(result.run_dir).eval_dir("public", "train"))
    session_run = tmp_path / "session-run"  # a copy: the session fixture's run folder stays as it is
    shutil.copytree(student_adapters["value_miner"].parent, session_run, symlinks=True)
    public_dir = student_export_dir / "value_miner"
    evaluate(session_run, "train", eval_cfg, datasets=[str(public_dir)], progress=lambda m: None)
    public_label = f"{student_export_dir.name}/value_miner"  # how eval names a dataset given by path
    public_before = read_predictions(RunDir(session_run).eval_dir(public_label, "train"))

    def reproduced(preds) -> set[str]:
        return {
            x["record_id"] for x in public if preds[x["record_id"]].output == x["messages"][-1]["content"]
        }

    # the public records the fine-tune replayed: a weight of 0.5 replays the same seeded half each
    # epoch, and the other half is what a fine-tune may forget (docs/train.md: check it with eval)
    public_rows = sft_data.load_dataset_dict(public_dir)["train"]
    sizes = [(len(public_rows), MIX[0][1]), (len(review_rows), MIX[1][1])]
    replayed = {public_rows[i]["record_id"] for i in sft_data.mixed_indices(sizes, cfg.seed)[0]}
    others = {x["record_id"] for x in public} - {old["record_id"]}
    known, kept = reproduced(public_before) & others, reproduced(public_after) & others
    print(
        f"\nsite fine-tune loop (tiny student): review records exported {len(review_rows)}; "
        f"fine-tune {result.global_step} steps in {train_s:.1f} s "
        f"(public x0.5 + site-reviews x4, {cfg.epochs:g} epochs, {cfg.lr:g} lr); "
        f"{ATOM} before {before['value']!r} -> after {after['value']!r} (reviewer: False); "
        f"other public records reproduced before / after the fine-tune: replayed "
        f"{len(known & replayed)} / {len(kept & replayed)} of {len(others & replayed)}, left out by the "
        f"weight {len(known - replayed)} / {len(kept - replayed)} of {len(others - replayed)}; "
        f"site-reviews exact {by_label['site-reviews']['exact_match']}; eval {eval_s:.1f} s"
    )
    assert after == corrected
    assert len(known) >= len(others) - 1  # the session student did learn its public set
    assert len(others & replayed) >= 4  # the check below has records to check
    forgotten = (known & replayed) - kept
    assert not forgotten, f"replayed public records forgotten by the fine-tune: {sorted(forgotten)}"
