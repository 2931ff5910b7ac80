"""`verdict teacher stats RUN`: calls, cache hits, rejected outputs by reason, tokens and cost.
`verdict teacher criteria`: the criterion-level cache's figures on a trial corpus."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from verdict.core.errors import VerdictError
from verdict.data_gen.formalizer import CallCache

from .records import ASSEMBLED, RecordStore


def find_run(run: str | Path, out_dir: str | Path = "runs") -> Path:
    p = Path(run)
    for cand in (p, Path(out_dir) / str(run)):
        if (cand / "records.sqlite").exists():
            return cand
    raise VerdictError(
        f"no teacher run '{run}' (looked for {p}/records.sqlite and "
        f"{Path(out_dir) / str(run)}/records.sqlite)"
    )


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
    # A stage made of several calls has one row per call and one assembled row per item.
    key = lambda r: f"{r.stage} (assembled)" if r.task == ASSEMBLED else r.stage  # noqa: E731
    for stage in sorted({key(r) for r in records}):
        rs = [r for r in records if key(r) == stage]
        rej = [r for r in rs if r.status == "rejected"]
        stages[stage] = {
            "records": len(rs),
            "accepted": len(rs) - len(rej),
            "rejected": len(rej),
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
        "run": name,
        "status": status,
        "records": len(records),
        "stages": stages,
        "calls": {
            "paid": sum(x["calls"] for x in paid),
            "cache_hits": sum(x["calls"] for x in hits),
            "unanswered_in_flight": lost,
        },
        "tokens": {
            "prompt": sum(x["prompt_tokens"] for x in paid),
            "completion": sum(x["completion_tokens"] for x in paid),
        },
        "cost_usd": round(sum(x["cost_usd"] for x in paid), 6),
        "ledger": ledger,
        "last_summary": last,
    }


def render_stats(s: dict) -> str:
    lines = [f"run {s['run']}: {s['status']}, {s['records']} records"]
    for stage, x in s["stages"].items():
        reasons = ", ".join(f"{k} {v}" for k, v in x["rejected_by_reason"].items()) or "-"
        lines.append(
            f"  {stage:28s} accepted {x['accepted']:5d}  rejected {x['rejected']:5d}  "
            f"(repaired {x['repaired']})  reasons: {reasons}"
        )
    c = s["calls"]
    lines.append(
        f"calls: {c['paid']} paid, {c['cache_hits']} cache hits"
        + (f", {c['unanswered_in_flight']} sent but unanswered (crash)" if c["unanswered_in_flight"] else "")
    )
    lines.append(
        f"tokens: {s['tokens']['prompt']} prompt, {s['tokens']['completion']} completion; "
        f"cost ${s['cost_usd']:.4f}"
    )
    for x in s["ledger"]:
        lines.append(
            f"  {x['stage']:16s} {x['teacher']:20s} {x['kind']:9s} {x['calls']:6d} calls  "
            f"{x['prompt_tokens']:9d} in  {x['completion_tokens']:8d} out  ${x['cost_usd']:.4f}"
        )
    return "\n".join(lines)


def criteria_figures(trial_files: list[str | Path], top: int = 10) -> dict:
    """Split every trial (criteria.py) and count what the criterion cache saves: a parser call is
    one (side, criterion text) request, so an exact repeat (after whitespace normalization, which
    the request applies too) is a cache hit. Case-folded and side-free counts are figures only."""
    from verdict.data_gen.formalizer import normalize_criterion, split_trial

    from .sources import load_trials

    trials: dict = {}
    problems: list[str] = []
    for f in trial_files:
        loaded = load_trials(f)
        problems += loaded.problems
        for t in loaded.items:
            trials.setdefault(t.trial_id, t)
    requests: Counter = Counter()
    folded: set = set()
    texts: set = set()
    headings = groups = 0
    per_trial = []
    for t in trials.values():
        split = split_trial(t)
        headings += len(split.headings)
        per_trial.append(len(split.criteria))
        for c in split.criteria:
            requests[(c.side, c.text)] += 1
            folded.add((c.side, normalize_criterion(c.text, case=True)))
            texts.add(c.text)
            groups += "\n" in c.text
    total = sum(requests.values())
    distinct = len(requests)
    per_trial.sort()
    return {
        "trials": len(trials),
        "criteria": total,
        "distinct": distinct,
        "cache_saves": round(1 - distinct / total, 4) if total else 0.0,
        "distinct_case_folded": len(folded),
        "cache_saves_case_folded": round(1 - len(folded) / total, 4) if total else 0.0,
        "distinct_texts_any_side": len(texts),
        "headings_dropped": headings,
        "groups": groups,
        "criteria_per_trial": {
            "median": per_trial[len(per_trial) // 2] if per_trial else 0,
            "max": per_trial[-1] if per_trial else 0,
        },
        "most_repeated": [
            {"side": s, "text": x, "trials": n} for (s, x), n in requests.most_common(top) if n > 1
        ],
        "problems": problems,
    }


def render_criteria_figures(f: dict) -> str:
    per = f["criteria_per_trial"]
    lines = [
        f"trials {f['trials']}: {f['criteria']} criteria (median {per['median']} per trial, "
        f"max {per['max']}), {f['headings_dropped']} heading lines dropped, "
        f"{f['groups']} lead-in groups",
        f"distinct requests (side + text): {f['distinct']}; the criterion cache saves "
        f"{f['cache_saves']:.1%} of parser calls",
        f"case-folded: {f['distinct_case_folded']} distinct ({f['cache_saves_case_folded']:.1%}); "
        f"ignoring the side: {f['distinct_texts_any_side']} distinct texts",
    ]
    for x in f["most_repeated"]:
        lines.append(f"  {x['trials']:5d}x {x['side']:9s} {x['text'][:90]}")
    lines.append(
        f"criteria: trials={f['trials']} total={f['criteria']} distinct={f['distinct']} "
        f"saved={f['cache_saves']:.4f} headings_dropped={f['headings_dropped']}"
    )
    return "\n".join(lines)
