"""`verdict teacher stats RUN`: calls, cache hits, rejected outputs by reason, tokens and cost."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from verdict_core.errors import VerdictError

from .cache import CallCache
from .records import RecordStore


def find_run(run: str | Path, out_dir: str | Path = "runs") -> Path:
    p = Path(run)
    for cand in (p, Path(out_dir) / str(run)):
        if (cand / "records.sqlite").exists():
            return cand
    raise VerdictError(f"no teacher run '{run}' (looked for {p}/records.sqlite and {Path(out_dir) / str(run)}/records.sqlite)")


def run_stats(run_dir: str | Path) -> dict:
    d = Path(run_dir)
    store = RecordStore(d / "records.sqlite")
    try:
        records = store.records()
        cache_path = store.get_meta("cache")
        status = store.get_meta("status", "unknown")
        config = store.get_meta("config", {}) or {}
        last = store.get_meta("last_summary")
    finally:
        store.close()
    name = config.get("name", d.name)
    stages = {}
    for stage in sorted({r.stage for r in records}):
        rs = [r for r in records if r.stage == stage]
        rej = [r for r in rs if r.status == "rejected"]
        stages[stage] = {
            "records": len(rs), "accepted": len(rs) - len(rej), "rejected": len(rej),
            "repaired": sum(r.repaired for r in rs if r.status == "accepted"),
            "rejected_by_reason": dict(Counter(r.reason or "unknown" for r in rej).most_common()),
        }
    ledger, lost = [], 0
    if cache_path and Path(cache_path).exists():
        cache = CallCache(cache_path)
        try:
            ledger = cache.ledger_summary(name)
            lost = len(cache.inflight(name))
        finally:
            cache.close()
    paid = [x for x in ledger if x["kind"] == "paid"]
    hits = [x for x in ledger if x["kind"] == "cache_hit"]
    return {
        "run": name, "status": status, "records": len(records), "stages": stages,
        "calls": {"paid": sum(x["calls"] for x in paid), "cache_hits": sum(x["calls"] for x in hits),
                  "unanswered_in_flight": lost},
        "tokens": {"prompt": sum(x["prompt_tokens"] for x in paid), "completion": sum(x["completion_tokens"] for x in paid)},
        "cost_usd": round(sum(x["cost_usd"] for x in paid), 6),
        "ledger": ledger,
        "last_summary": last,
    }


def render_stats(s: dict) -> str:
    lines = [f"run {s['run']}: {s['status']}, {s['records']} records"]
    for stage, x in s["stages"].items():
        reasons = ", ".join(f"{k} {v}" for k, v in x["rejected_by_reason"].items()) or "-"
        lines.append(f"  {stage:16s} accepted {x['accepted']:5d}  rejected {x['rejected']:5d}  "
                     f"(repaired {x['repaired']})  reasons: {reasons}")
    c = s["calls"]
    lines.append(f"calls: {c['paid']} paid, {c['cache_hits']} cache hits"
                 + (f", {c['unanswered_in_flight']} sent but unanswered (crash)" if c["unanswered_in_flight"] else ""))
    lines.append(f"tokens: {s['tokens']['prompt']} prompt, {s['tokens']['completion']} completion; "
                 f"cost ${s['cost_usd']:.4f}")
    for x in s["ledger"]:
        lines.append(f"  {x['stage']:16s} {x['teacher']:20s} {x['kind']:9s} {x['calls']:6d} calls  "
                     f"{x['prompt_tokens']:9d} in  {x['completion_tokens']:8d} out  ${x['cost_usd']:.4f}")
    return "\n".join(lines)
