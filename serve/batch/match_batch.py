"""Site-wide screening from JSONL: patients x trials, sharded across GPU jobs.

    plan = plan_batch(...)            # out/plan.json: inputs, policy, shards (nothing computed yet)
    await run_shard(out, shard)       # one vLLM + the matching service in-process, this shard's pairs
    merge_results(out)                # out/results.jsonl: every shard, deduplicated

Pairs are sharded by trial (a stable hash of the trial id), so each trial is parsed by exactly one
shard, once. A shard appends one line per finished pair to `shards/<i>/results.jsonl` (the
project's JSONL record store, `verdict.core.jsonl_store`: flushed and fsynced, a line torn by a
kill cut on resume), so a killed or preempted job loses at most the pairs in flight: run it again and it
does only what is missing. Merging keeps one line per (patient, trial, program version, policy).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from verdict.core.configs import find_config
from verdict.core.decision import Decision
from verdict.core.jsonl_store import JsonlStore
from verdict.core.policy import load_policy
from verdict.core.progress import Progress
from verdict.core.ranking import rank
from verdict.data_gen.fhir.models import FhirPatientRecord
from verdict.data_gen.formalizer import PairCost, cost_total
from verdict.data_gen.sources import load_pairs, load_patients, load_trials

from ..audit import AuditStore
from ..config import load_serve_config
from ..errors import BatchError, ServiceError
from ..matching.protocol import MatchRequest
from ..protocol import NoteInput, PatientInput
from ..services import Services
from ..vllm.server import VLLMServer

PLAN = "plan.json"
# Outcomes a rerun does not retry: a decision, or a model output that failed validation (greedy
# decoding would fail the same way). Unavailable formalizers and the like are retried.
FINAL_STATUSES = (200, 404, 422, 502)


class BatchPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["verdict.match_batch/v1"] = "verdict.match_batch/v1"
    name: str
    serve_config: str = Field(description="serve config (absolute path) each shard starts vLLM from")
    overrides: list[str] = Field(default_factory=list)
    patients: str
    trials: str
    trials_format: Literal["auto", "jsonl", "ctgov"] = "auto"
    pairs: str | None = None
    policy: str = "prescreen"
    shards: int = Field(ge=1, le=10000)
    counts: dict[str, int] = Field(default_factory=dict)


class ResultLine(BaseModel):
    key: str = Field(description="patient_id|trial_id|program_hash|policy")
    patient_id: str
    trial_id: str
    program_hash: str | None = None
    policy: str
    status: int
    decision: str | None = None
    decision_id: str | None = None
    result: dict | None = Field(None, description="the full Decision")
    error: dict | None = None
    cost: PairCost | None = Field(None, description="what the pair cost the formalizer (decided pairs)")
    shard: int
    finished_at: float


def patient_input(doc):
    """A loaded patient (`verdict.data_gen.formalizer.protocol.PatientDoc`) as the match request
    takes it: its documents as `notes` when it has several, else its text as `note`."""

    if doc.fhir is not None:  # read from FHIR: the record goes as it is, its coded facts decide atoms
        return PatientInput(patient_id=doc.patient_id, fhir=FhirPatientRecord.model_validate(doc.fhir))
    if not doc.documents:
        return PatientInput(patient_id=doc.patient_id, note=doc.text)
    notes = [NoteInput(id=d.id, text=d.text, date=d.date, kind=d.kind) for d in doc.documents]
    return PatientInput(patient_id=doc.patient_id, notes=notes)


def shard_of(trial_id: str, shards: int) -> int:
    return int(hashlib.sha256(trial_id.encode()).hexdigest()[:12], 16) % shards


def load_inputs(plan: BatchPlan):

    patients = load_patients(plan.patients)
    trials = load_trials(plan.trials, format=plan.trials_format)
    problems = patients.problems + trials.problems
    pairs = None
    if plan.pairs:
        loaded = load_pairs(plan.pairs)
        problems += loaded.problems
        pairs = [(p.patient_id, p.trial_id) for p in loaded.items]
    if problems:
        raise BatchError("batch inputs have problems", problems[:30])
    pats, trs = patients.by_id("patient_id"), trials.by_id("trial_id")
    if pairs is None:
        pairs = [(p, t) for t in trs for p in pats]
    unknown = sorted(
        {f"patient '{p}'" for p, _ in pairs if p not in pats}
        | {f"trial '{t}'" for _, t in pairs if t not in trs}
    )
    if unknown:
        raise BatchError("pairs name unknown ids", unknown[:30])
    return pats, trs, list(dict.fromkeys(pairs))


def plan_batch(
    out: str | Path,
    *,
    name: str,
    serve_config: str | Path,
    patients: str | Path,
    trials: str | Path,
    pairs: str | Path | None = None,
    policy: str = "prescreen",
    shards: int = 1,
    overrides: list[str] | None = None,
    trials_format: str = "auto",
) -> BatchPlan:
    """Check the inputs and write out/plan.json. Re-planning an existing folder must not change it."""

    cfg_path = find_config("serve", str(serve_config)).resolve()
    cfg = load_serve_config(cfg_path, overrides)
    cfg.require("vllm")
    cfg.require("api")
    load_policy(policy)
    plan = BatchPlan(
        name=name,
        serve_config=str(cfg_path),
        overrides=list(overrides or []),
        patients=str(Path(patients).resolve()),
        trials=str(Path(trials).resolve()),
        trials_format=trials_format,
        pairs=str(Path(pairs).resolve()) if pairs else None,
        policy=policy,
        shards=shards,
    )
    pats, trs, pair_list = load_inputs(plan)
    plan.counts = {"patients": len(pats), "trials": len(trs), "pairs": len(pair_list)}
    out = Path(out)
    existing = out / PLAN
    if existing.exists():
        old = BatchPlan.model_validate_json(existing.read_text())
        if old.model_dump(exclude={"counts"}) != plan.model_dump(exclude={"counts"}):
            raise BatchError(
                f"{out} already holds a different batch plan: use a new folder, or the same inputs "
                "and options to resume it"
            )
        return old
    out.mkdir(parents=True, exist_ok=True)
    existing.write_text(plan.model_dump_json(indent=2))
    return plan


def load_plan(out: str | Path) -> BatchPlan:
    path = Path(out) / PLAN
    if not path.exists():
        raise BatchError(f"no batch plan in {out} (run `verdict match batch` first)")
    return BatchPlan.model_validate_json(path.read_text())


def result_path(out: Path, shard: int) -> Path:
    return out / "shards" / str(shard) / "results.jsonl"


def result_store(path: Path) -> JsonlStore[ResultLine]:
    """A shard's results file: fsynced appends, a line torn by a kill cut before the next append."""
    return JsonlStore(path, ResultLine, durable=True)


def read_results(path: Path) -> list[ResultLine]:
    """Complete lines only: a line cut by a crash is ignored (and redone)."""
    return result_store(path).load()


async def run_shard(
    out: str | Path,
    shard: int,
    *,
    formalizer_url: str | None = None,
    progress: Progress = lambda m: None,
) -> dict[str, int]:
    """Match this shard's pairs that have no final result yet. Starts vLLM from the plan's serve
    config unless ``formalizer_url`` names a running server."""

    out = Path(out)
    plan = load_plan(out)
    if not 0 <= shard < plan.shards:
        raise BatchError(f"shard {shard} is outside 0..{plan.shards - 1}")
    cfg = load_serve_config(plan.serve_config, plan.overrides)
    pats, trs, pairs = load_inputs(plan)
    mine = [(p, t) for p, t in pairs if shard_of(t, plan.shards) == shard]
    path = result_path(out, shard)
    done = {(r.patient_id, r.trial_id) for r in read_results(path) if r.status in FINAL_STATUSES}
    todo = [pt for pt in mine if pt not in done]
    progress(
        f"shard {shard}/{plan.shards}: {len(mine)} pairs, {len(mine) - len(todo)} already done, "
        f"{len(todo)} to do"
    )
    if not todo:
        return {"pairs": len(mine), "done_before": len(mine), "matched": 0, "failed": 0}

    server = None
    if formalizer_url is None:
        vcfg = cfg.require("vllm").model_copy(
            update={"port": 0, "log_file": str(out / "shards" / str(shard) / "vllm.log")}
        )
        server = VLLMServer(vcfg)
        progress(f"shard {shard}: starting vLLM")
        server.start(wait=False)
        try:
            server.wait_ready(progress=progress)
        except BaseException:
            server.stop()
            raise
        formalizer_url = server.base_url
    try:
        return await _match_pairs(
            cfg.require("api"), formalizer_url, out, shard, plan, pats, trs, todo, mine, progress
        )
    finally:
        if server is not None:
            server.stop()


async def _match_pairs(
    api, formalizer_url, out, shard, plan, pats, trs, todo, mine, progress
) -> dict[str, int]:

    shard_dir = out / "shards" / str(shard)
    shard_dir.mkdir(parents=True, exist_ok=True)
    api = api.model_copy(update={"audit_db": str(shard_dir / "audit.sqlite")})
    service = Services(api, formalizer_url, audit=AuditStore(api.audit_db, store_notes=api.store_notes))
    caller = f"batch:{plan.name}:{shard}"
    counts = {"pairs": len(mine), "done_before": len(mine) - len(todo), "matched": 0, "failed": 0}
    t0 = time.monotonic()
    sink = result_store(result_path(out, shard)).open()
    sem = asyncio.Semaphore(api.limits.batch_concurrency)
    program_hash: dict[str, str] = {}
    parse_failed: dict[str, Exception] = {}  # a trial whose parse failed is not retried pair by pair

    async def one(pid: str, tid: str) -> None:
        async with sem:
            key_base = f"{pid}|{tid}"
            try:
                if tid in parse_failed:
                    raise parse_failed[tid]
                if tid not in program_hash:  # a trial is parsed once (concurrent waiters share the parse)
                    try:
                        row, _ = await service.trials.parsed_trial(trs[tid], caller)
                    except ServiceError as e:
                        parse_failed[tid] = e
                        raise
                    program_hash[tid] = row.program_hash
                res = await service.matching.match(
                    MatchRequest(
                        trial_id=tid,
                        program_hash=program_hash[tid],
                        policy=plan.policy,
                        patient=patient_input(pats[pid]),
                    ),
                    caller,
                    "pinned",  # the version this run parsed, as the operator asked
                )
                line = ResultLine(
                    key=f"{key_base}|{res.program_hash}|{plan.policy}",
                    patient_id=pid,
                    trial_id=tid,
                    program_hash=res.program_hash,
                    policy=plan.policy,
                    status=200,
                    decision=res.decision.decision,
                    decision_id=res.decision_id,
                    result=res.decision.model_dump(mode="json", by_alias=True),
                    cost=res.cost,
                    shard=shard,
                    finished_at=time.time(),
                )
                counts["matched"] += 1
            except ServiceError as e:
                line = ResultLine(
                    key=f"{key_base}|{program_hash.get(tid)}|{plan.policy}",
                    patient_id=pid,
                    trial_id=tid,
                    program_hash=program_hash.get(tid),
                    policy=plan.policy,
                    status=e.status,
                    error={"error": e.code, "message": e.summary},
                    shard=shard,
                    finished_at=time.time(),
                )
                counts["failed"] += 1
            sink.append(line)
            n = counts["matched"] + counts["failed"]
            if n % 10 == 0 or n == len(todo):
                rate = n / max(time.monotonic() - t0, 1e-9)
                progress(f"shard {shard}: {n}/{len(todo)} ({rate:.2f} pairs/s)")

    try:
        # Trials in order, so a trial's first pair parses it while its other pairs wait on the lock.
        await asyncio.gather(*(one(p, t) for p, t in sorted(todo, key=lambda pt: (pt[1], pt[0]))))
    finally:
        sink.close()
        await service.aclose()
        service.audit.close()
    return counts


def merge_results(out: str | Path) -> dict:
    """out/results.jsonl: one line per (patient, trial) pair - the first decision any attempt reached,
    else its first error; the line's `key` names the program version and policy it was decided under
    (one policy per batch). out/summary.json: counts. Safe to run at any time, as often as wanted."""
    out = Path(out)
    plan = load_plan(out)
    best: dict[tuple[str, str], ResultLine] = {}
    lines = 0
    for shard in range(plan.shards):
        for r in read_results(result_path(out, shard)):
            lines += 1
            k = (r.patient_id, r.trial_id)
            prev = best.get(k)
            # a decision beats an error; among equals the first line stands (reruns append)
            if prev is None or (prev.status != 200 and r.status == 200):
                best[k] = r
    merged = sorted(best.values(), key=lambda r: (r.trial_id, r.patient_id))
    tmp = out / "results.jsonl.tmp"
    with open(tmp, "w") as f:
        for r in merged:
            f.write(r.model_dump_json(exclude={"shard"}) + "\n")
    os.replace(tmp, out / "results.jsonl")
    by_decision: dict[str, int] = {}
    for r in merged:
        by_decision[r.decision or f"error:{r.status}"] = (
            by_decision.get(r.decision or f"error:{r.status}", 0) + 1
        )
    summary = {
        "pairs_planned": plan.counts.get("pairs"),
        "results": len(merged),
        "lines_read": lines,
        "duplicates_dropped": lines - len(merged),
        "missing": (plan.counts.get("pairs") or 0) - len(merged),
        "by_decision": dict(sorted(by_decision.items())),
        # what the decided pairs sent to the formalizer (reruns' cache hits are free)
        "cost": cost_total([r.cost for r in merged if r.cost is not None]),
    }
    summary["ranked"] = write_rankings(out, merged)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def write_rankings(out: Path, merged: list[ResultLine]) -> dict[str, int]:
    """Site-wide screening from a batch: `out/ranked_by_patient.jsonl` (each patient's trials) and
    `out/ranked_by_trial.jsonl` (each trial's patients), one line per group, its pairs in the order
    of `verdict.core.ranking` with the decision ids. A pair without a decision has no rank: it stays
    in results.jsonl with its error, and is counted under `unranked`."""

    decided = [(r, Decision.model_validate(r.result)) for r in merged if r.status == 200 and r.result]
    ids = {(r.patient_id, r.trial_id): r.decision_id for r, _ in decided}
    for by in ("patient", "trial"):
        groups: dict[str, list[Decision]] = {}
        for r, d in decided:
            groups.setdefault(r.patient_id if by == "patient" else r.trial_id, []).append(d)
        tmp = out / f"ranked_by_{by}.jsonl.tmp"
        with open(tmp, "w") as f:
            for key in sorted(groups):
                rows = [
                    {**row.model_dump(), "decision_id": ids[(row.patient_id, row.trial_id)]}
                    for row in rank(groups[key])
                ]
                f.write(json.dumps({f"{by}_id": key, "rows": rows}) + "\n")
        os.replace(tmp, out / f"ranked_by_{by}.jsonl")
    return {"pairs": len(decided), "unranked": len(merged) - len(decided)}


def render_batch_jobs(
    out: str | Path, slurm_config: str | Path, slurm_overrides: list[str] | None = None
) -> dict:
    """out/slurm/match.sbatch (an array, one task per shard, one GPU each) and merge.sbatch."""
    # heavy optional dependency: verdict.slurm: jinja2 (slurm extra)
    from verdict.slurm.job_config import load_slurm_config
    from verdict.slurm.render import render_text

    out = Path(out).resolve()
    plan = load_plan(out)
    slurm = load_slurm_config(find_config("slurm", str(slurm_config)), slurm_overrides)
    worker = (
        shlex.join(["verdict", "match", "worker", "--out", str(out)]) + ' --shard "${SLURM_ARRAY_TASK_ID:-0}"'
    )
    merge = shlex.join(["verdict", "match", "merge", "--out", str(out)])
    scripts = out / "slurm"
    scripts.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, command, res, array in (
        ("match", worker, slurm.jobs.serve, f"0-{plan.shards - 1}"),
        ("match-merge", merge, slurm.jobs.eval_report, None),
    ):
        text = render_text(
            "match.sbatch.j2",
            kind,
            slurm,
            plan.name,
            command,
            res,
            array=array,
            run_name=plan.name,
            shards=plan.shards,
            merge=kind == "match-merge",
        )
        p = scripts / f"{kind}.sbatch"
        p.write_text(text)
        p.chmod(0o755)
        paths[kind] = p
    return paths
