"""From per-pair results to the run's numbers (results.json), its report (report.md), and the
side-by-side comparison of two runs (`verdict bench compare`).

Conventions (also in docs/bench.md):
- scores use repeat 0; repeats only measure consistency;
- a pair a backend cannot decide at all (no recorded formalization, no criteria text) is
  *unavailable*: outside that backend's scores, reported as coverage; a pair whose output stayed
  invalid after the repair, or whose decision is undetermined, counts as not eligible
  (``scoring.failed_as: ineligible``) or is left out (``excluded``);
- the trial parser's cost and latency are counted once per trial (its result serves every pair of
  the trial); per-pair latency is the pair's own critical path (value-miner passes, which run
  concurrently, plus resolving and solving; or the direct matcher's one call);
- comparisons between backends use the pairs both scored ("common pairs").
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from verdict.core.jsonl_store import JsonlStore

from . import metrics as M
from .markdown import rate_text, row, section, table
from .protocol import BenchError, PairResult

FORMAT = "verdict.bench/v1"
MACHINERY_CHECK = (
    "**Machinery check** (`purpose: machinery_check`): the figures below come from a scripted server "
    "and test the bench's machinery; they are not results, and no published figure is set beside them."
)
PAIRS_FILE = "pairs.jsonl"


def pair_store(run_dir: Path) -> JsonlStore[PairResult]:
    """A run's ``pairs.jsonl``: one PairResult a line, appended as each pair finishes."""
    return JsonlStore(Path(run_dir) / PAIRS_FILE, PairResult, exclude_defaults=True)


def load_pairs(run_dir: Path) -> list[PairResult]:
    """The run's results, the last line of each (backend, repeat, pair) counting."""
    return list(pair_store(run_dir).latest(lambda r: r.key).values())


# ---- per-backend numbers ------------------------------------------------------------------------
def _predicted(r: PairResult) -> bool:
    return r.status == "decided" and r.decision == "eligible"


def _scored(rs: list[PairResult], failed_as: str) -> list[PairResult]:
    # pair-id order: results arrive in completion order, the bootstrap must not depend on it
    out = sorted((r for r in rs if r.status != "unavailable"), key=lambda r: r.pair_id)
    if failed_as == "excluded":
        out = [r for r in out if r.status == "decided" and r.decision != "undetermined"]
    return out


def _scores(rs: list[PairResult], scoring) -> dict:
    rs = sorted(rs, key=lambda r: r.pair_id)  # the bootstrap resamples by position: fix the order
    return M.binary_scores(
        [r.label == "eligible" for r in rs],
        [_predicted(r) for r in rs],
        b=scoring.bootstrap_b,
        seed=scoring.seed,
    )


def _stage_rows(rs: list[PairResult]) -> dict[str, list]:
    """Stage stats, the shared parser result once per trial."""
    rows: dict[str, list] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for r in rs:
        for name, s in r.stages.items():
            if s.shared:
                if (name, r.trial_id) in seen:
                    continue
                seen.add((name, r.trial_id))
            rows[name].append(s)
    return rows


def backend_summary(
    name: str, kind: str, rs_all: list[PairResult], n_pairs: int, scoring, repeats: int
) -> dict:
    """One backend's numbers: coverage, scores, output validity, latency, cost, accountability."""
    rs = [r for r in rs_all if r.repeat == 0]
    stage_rows = _stage_rows(rs)
    out = _coverage_and_scores(kind, rs, n_pairs, scoring)
    out["validity"] = _validity_by_stage(stage_rows)
    out["latency_ms"] = _latency(rs, stage_rows)
    out.update(_tokens_and_cost(stage_rows, n_usable=len([r for r in rs if r.status != "unavailable"])))
    if any(r.status == "decided" and r.program_hash for r in rs):
        out["pivotal_flip_rate"] = _pivotal_flip_rate(rs)
    if repeats > 1:
        out["consistency"] = _consistency(rs_all, repeats)
    return out


def _coverage_and_scores(kind: str, rs: list[PairResult], n_pairs: int, scoring) -> dict:
    """How many pairs were run, decided, failed, unavailable and scored; the scores; why pairs failed."""
    status = Counter(r.status for r in rs)
    decisions = Counter(r.decision for r in rs if r.status == "decided")
    scored = _scored(rs, scoring.failed_as)
    return {
        "kind": kind,
        "coverage": {
            "pairs": n_pairs,
            "run": len(rs),
            "missing": n_pairs - len(rs),
            "decided": status["decided"],
            "failed": status["failed"],
            "unavailable": status["unavailable"],
            "undetermined": decisions["undetermined"],
            "scored": len(scored),
        },
        "decisions": {k: decisions[k] for k in ("eligible", "ineligible", "undetermined")},
        "metrics": _scores(scored, scoring),
        "failures": dict(Counter(r.reason or "?" for r in rs if r.status == "failed").most_common(20)),
        "unavailable": dict(
            Counter(r.reason or "?" for r in rs if r.status == "unavailable").most_common(20)
        ),
    }


def _validity_by_stage(stage_rows: dict[str, list]) -> dict:
    """Validity of structured outputs per stage (calls only: a pass with no atoms asks nothing)."""
    return {
        st: M.validity(
            [s.first_reason for s in rows if s.attempts], [s.status == "accepted" for s in rows if s.attempts]
        )
        for st, rows in sorted(stage_rows.items())
        if any(s.attempts for s in rows)
    }


def _latency(rs: list[PairResult], stage_rows: dict[str, list]) -> dict:
    """Pair latency, and each stage's model time (or the solver's) as p50/p95."""
    stages_ms = {
        st: M.latency_summary([s.model_ms for s in rows if s.attempts])
        for st, rows in sorted(stage_rows.items())
        if any(s.attempts for s in rows)
    }
    solve = [r.solve_ms for r in rs if r.solve_ms is not None]
    if solve:
        stages_ms["solve"] = M.latency_summary(solve)
    return {
        "pair": M.latency_summary([r.latency_ms for r in rs if r.latency_ms is not None]),
        "stages": stages_ms,
    }


def _tokens_and_cost(stage_rows: dict[str, list], n_usable: int) -> dict:
    """Tokens and cost per pair the backend worked on (the parser once per trial); {} without calls."""
    calls = [s for rows in stage_rows.values() for s in rows]
    if not any(s.attempts for s in calls):
        return {}
    n = max(1, n_usable)
    pt = sum(s.prompt_tokens for s in calls)
    ct = sum(s.completion_tokens for s in calls)
    cost = sum(s.cost_usd for s in calls)
    return {
        "tokens": {
            "prompt_per_pair": pt / n,
            "completion_per_pair": ct / n,
            "prompt_total": pt,
            "completion_total": ct,
        },
        "cost_usd": {
            "per_pair": cost / n,
            "total": cost,
            "paid": sum(s.paid_usd for s in calls),
            "calls": sum(s.attempts for s in calls),
            "cache_hits": sum(s.cached_calls for s in calls),
        },
    }


def _pivotal_flip_rate(rs: list[PairResult]) -> dict:
    """The formal counterfactuals' flip rate per direction (paper Def. 3)."""
    flips = [f for r in rs for f in r.flips]
    return {
        d: M.rate(
            sum(f.flipped for f in flips if f.direction == d), sum(1 for f in flips if f.direction == d)
        )
        for d in ("to_eligible", "to_ineligible")
    }


def _consistency(rs_all: list[PairResult], repeats: int) -> dict:
    """Whether repeats decide each pair the same, and the same facts the same way."""
    by_pair: dict[str, list[str]] = defaultdict(list)
    by_facts: dict[tuple, list[str]] = defaultdict(list)
    for r in rs_all:
        if r.status == "decided":
            by_pair[r.pair_id].append(r.decision)
            if r.program_hash and r.patient_hash:
                by_facts[(r.program_hash, r.patient_hash)].append(r.decision)
    cons = {"repeats": repeats, "same_decision": M.consistency(by_pair)}
    if by_facts:
        cons["same_facts_same_decision"] = M.consistency(by_facts)
    return cons


# ---- comparisons --------------------------------------------------------------------------------
def compare_backends(a: list[PairResult], b: list[PairResult], scoring) -> dict:
    """Agreement and McNemar's exact tests on the pairs both backends scored (repeat 0)."""
    ra = {r.pair_id: r for r in _scored([r for r in a if r.repeat == 0], scoring.failed_as)}
    rb = {r.pair_id: r for r in _scored([r for r in b if r.repeat == 0], scoring.failed_as)}
    common = [p for p in ra if p in rb]
    pa = [_predicted(ra[p]) for p in common]
    pb = [_predicted(rb[p]) for p in common]
    gold = [ra[p].label == "eligible" for p in common]
    right_a = [x == g for x, g in zip(pa, gold)]
    right_b = [x == g for x, g in zip(pb, gold)]
    only_a = sum(1 for x, y in zip(right_a, right_b) if x and not y)
    only_b = sum(1 for x, y in zip(right_a, right_b) if y and not x)
    return {
        "pairs": len(common),
        "decisions": M.agreement(pa, pb),
        "correctness": {
            "a_right_b_wrong": only_a,
            "b_right_a_wrong": only_b,
            "mcnemar_p": M.mcnemar_exact(only_a, only_b),
        },
        "f1": {
            "a": M.f1(M.confusion(gold, pa)) if common else None,
            "b": M.f1(M.confusion(gold, pb)) if common else None,
        },
        "accuracy": {
            "a": M.accuracy(M.confusion(gold, pa)) if common else None,
            "b": M.accuracy(M.confusion(gold, pb)) if common else None,
        },
    }


def summarize(
    config, dataset, results: list[PairResult], problems: list[str], status: str = "complete"
) -> dict:
    from .ranking_report import ranking_section

    by_backend: dict[str, list[PairResult]] = defaultdict(list)
    for r in results:
        if not r.ranking_only:  # decided for the ranking metrics only, never scored as a decision
            by_backend[r.backend].append(r)
    n = len(dataset.pairs)
    scoring = config.scoring
    backends = {
        b.name: backend_summary(b.name, b.kind, by_backend.get(b.name, []), n, scoring, config.repeats)
        for b in config.backends
    }
    for b in config.backends:  # the formalizer's opt-in stages (off by default): the report says they ran
        if on := [st for st in ("arbiter", "verbalizer") if getattr(b, st, False)]:
            backends[b.name]["optional_stages"] = on
    names = [b.name for b in config.backends]
    comparisons = [
        {"a": x, "b": y, **compare_backends(by_backend.get(x, []), by_backend.get(y, []), scoring)}
        for i, x in enumerate(names)
        for y in names[i + 1 :]
    ]
    # every backend on the pairs all of them scored, when their coverage differs
    scored_sets = {
        nm: {
            r.pair_id
            for r in _scored([r for r in by_backend.get(nm, []) if r.repeat == 0], scoring.failed_as)
        }
        for nm in names
    }
    common_ids = set.intersection(*scored_sets.values()) if scored_sets else set()
    common = None
    if len(names) > 1 and any(s != common_ids for s in scored_sets.values()):
        common = {
            "pairs": len(common_ids),
            "metrics": {
                nm: _scores(
                    [r for r in by_backend.get(nm, []) if r.repeat == 0 and r.pair_id in common_ids], scoring
                )
                for nm in names
            },
        }
    ranking = ranking_section(config, dataset, results)
    complete = (
        status == "complete"
        and all(s["coverage"]["missing"] == 0 for s in backends.values())
        and not (ranking and ranking["ranking_only_missing"])
    )
    return {
        "format": FORMAT,
        "name": config.name,
        "description": config.description,
        "purpose": config.purpose,
        "status": status if status != "complete" or complete else "incomplete",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": config.model_dump(mode="json"),
        "policy": config.policy,
        "repeats": config.repeats,
        "scoring": scoring.model_dump(),
        "dataset": dataset.summary(),
        "input_problems": list(problems),
        "backends": backends,
        "common_pairs": common,
        "comparisons": comparisons,
        "reference_points": [p.model_dump() for p in config.reference_points],
        "ranking": ranking,
    }


# ---- markdown -----------------------------------------------------------------------------------
def _f(x, nd: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _ci(m: dict) -> str:
    if m.get("value") is None:
        return "n/a"
    ci = m.get("ci95")
    return f"{m['value']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{m['value']:.3f}"


def _ms(x) -> str:
    return "n/a" if x is None else (f"{x:.0f}" if x >= 100 else f"{x:.1f}")


def _usd(x) -> str:
    return "n/a" if x is None else f"${x:.5f}" if x < 0.01 else f"${x:.4f}"


def render_markdown(s: dict) -> str:
    """The run's report.md: what ran on what, then one section per measure."""
    from .chart_reading import render_chart_reading
    from .counterfactual import render_cf
    from .ranking_report import render_ranking

    check = s.get("purpose") == "machinery_check"
    skipped = s["dataset"]["problems"] + s.get("input_problems", [])
    lines = _setting(s, check, skipped)
    lines += _accuracy(s, check)
    lines += _agreement(s)
    lines += _validity(s)
    lines += _latency_and_cost(s)
    lines += _accountability(s)
    lines += render_ranking(s, check)
    lines += render_cf(s, check)
    lines += render_chart_reading(s, check)
    lines += _failures_plots_and_skipped(s, skipped)
    return "\n".join(lines) + "\n"


def _setting(s: dict, check: bool, skipped: list[str]) -> list[str]:
    """The title and what the run is: dataset, policy, scoring conventions, opt-in stages."""
    ds = s["dataset"]
    lines = [f"# Benchmark `{s['name']}`", ""]
    if check:
        lines += [MACHINERY_CHECK, ""]
    if s.get("description"):
        lines += [s["description"], ""]
    lines += [
        f"- status: **{s['status']}**; created {s['created']}",
        f"- dataset: `{ds['kind']}`, {ds['pairs']} pairs ({ds['labels']['eligible']} eligible, "
        f"{ds['labels']['ineligible']} ineligible), {ds['patients']} patients, {ds['trials']} trials"
        + (f"; sampled from {ds['before_sampling']}" if ds.get("before_sampling") is not None else ""),
        f"- policy: `{s['policy']}`; repeats: {s['repeats']}; failed pairs count as "
        f"{'not eligible' if s['scoring']['failed_as'] == 'ineligible' else 'left out'}; 95% CIs: "
        f"bootstrap over pairs, B={s['scoring']['bootstrap_b']}, seed {s['scoring']['seed']}",
    ]
    if ds.get("dropped"):
        lines.append("- dropped by design: " + ", ".join(f"{v} {k}" for k, v in ds["dropped"].items()))
    lines.append(f"- input rows skipped (reported, never scored): {len(skipped)}")
    lines += [
        f"- backend `{name}`: opt-in stages on: {', '.join(b['optional_stages'])}"
        for name, b in s["backends"].items()
        if b.get("optional_stages")
    ]
    return lines


def _accuracy(s: dict, check: bool) -> list[str]:
    """Decision accuracy per backend, on the common pairs, and the published reference points
    (never beside a machinery check)."""
    columns = (
        "backend | kind | scored | F1 [95% CI] | precision | recall | accuracy [95% CI] | failed | "
        "unavailable"
    )
    lines = section("Decision accuracy", columns)
    for name, b in s["backends"].items():
        m, c = b["metrics"], b["coverage"]
        lines.append(
            f"| {name} | {b['kind']} | {c['scored']} | {_ci(m['f1'])} | {_f(m['precision']['value'])} | "
            f"{_f(m['recall']['value'])} | {_ci(m['accuracy'])} | {c['failed']} | {c['unavailable']} |"
        )
    if s.get("common_pairs"):
        cp = s["common_pairs"]
        lines += ["", f"On the {cp['pairs']} pairs every backend scored:", ""]
        lines += table("backend | F1 [95% CI] | accuracy [95% CI]")
        lines += [row([name, _ci(m["f1"]), _ci(m["accuracy"])]) for name, m in cp["metrics"].items()]
    if s.get("reference_points") and not check:
        lines += ["", "Reference points (published; not measured here):", ""]
        lines += table("source | F1 | accuracy | pairs")
        for p in s["reference_points"]:
            source = f"{p['label']}{' (' + p['source'] + ')' if p.get('source') else ''}"
            lines.append(row([source, _f(p.get("f1")), _f(p.get("accuracy")), p.get("n") or "n/a"]))
    return lines


def _agreement(s: dict) -> list[str]:
    """Agreement and McNemar's tests between every two backends, on the pairs both scored."""
    if not s["comparisons"]:
        return []
    columns = (
        "A | B | pairs | agreement | kappa | A elig. only | B elig. only | McNemar p (decisions) | "
        "A right, B wrong | B right, A wrong | McNemar p (correctness)"
    )
    lines = section("Agreement between backends (same pairs)", columns)
    for c in s["comparisons"]:
        d, k = c["decisions"], c["correctness"]
        lines.append(
            f"| {c['a']} | {c['b']} | {c['pairs']} | {_f(d['rate'])} | {_f(d['kappa'])} | "
            f"{d['a_only']} | {d['b_only']} | {_f(d['mcnemar_p'], 4)} | {k['a_right_b_wrong']} | "
            f"{k['b_right_a_wrong']} | {_f(k['mcnemar_p'], 4)} |"
        )
    return lines


def _validity(s: dict) -> list[str]:
    """How often each stage's structured output was valid, first try and after its repair."""
    columns = (
        "backend | stage | outputs | JSON valid | schema valid | valid first try | accepted after repair"
    )
    lines = section("Structured outputs", columns)
    rows = [
        f"| {name} | {st} | {v['n']} | {rate_text(v['json_valid'])} | {rate_text(v['schema_valid'])} | "
        f"{rate_text(v['valid_first_try'])} | {rate_text(v['accepted_after_repair'])} |"
        for name, b in s["backends"].items()
        for st, v in b.get("validity", {}).items()
    ]
    return lines + (rows or ["| (no model calls in this run) | | | | | | |"])


def _latency_and_cost(s: dict) -> list[str]:
    """Per backend: pair and stage latency, tokens and cost per pair, and what this run paid."""
    columns = (
        "backend | pair p50 ms | pair p95 ms | stage p50/p95 ms | prompt tok/pair | "
        "completion tok/pair | cost/pair | cost total | paid by this run"
    )
    intro = (
        "Latency: per pair, its own critical path; per stage, the model time of its calls (as recorded "
        "when answered) or the solver's time. The trial parser counts once per trial."
    )
    lines = section("Latency and cost", columns, [intro])
    for name, b in s["backends"].items():
        lat = b["latency_ms"]
        stages = (
            "; ".join(f"{st} {_ms(v['p50'])}/{_ms(v['p95'])}" for st, v in lat["stages"].items()) or "n/a"
        )
        t, c = b.get("tokens"), b.get("cost_usd")
        lines.append(
            f"| {name} | {_ms(lat['pair']['p50'])} | {_ms(lat['pair']['p95'])} | {stages} | "
            f"{_f(t['prompt_per_pair'], 0) if t else 'n/a'} | "
            f"{_f(t['completion_per_pair'], 0) if t else 'n/a'} | "
            f"{_usd(c['per_pair']) if c else 'n/a'} | {_usd(c['total']) if c else 'n/a'} | "
            f"{_usd(c['paid']) if c else 'n/a'} |"
        )
    return lines


def _accountability(s: dict) -> list[str]:
    """PivotalFlipRate per direction and the consistency of repeated runs, per backend."""
    lines = section(
        "Accountability",
        "backend | PivotalFlipRate ineligible->eligible | PivotalFlipRate eligible->ineligible | "
        "same decision across repeats | same facts -> same decision",
        [
            "PivotalFlipRate: each decision's primary pivotal conditions applied (the formal "
            "counterfactual), decided again; the share that flips (Wilson 95% CI). Consistency: repeated "
            "runs of each backend over the same pairs."
        ],
    )
    for name, b in s["backends"].items():
        pf = b.get("pivotal_flip_rate") or {}
        cons = b.get("consistency") or {}
        same_facts = cons.get("same_facts_same_decision")
        lines.append(
            f"| {name} | {rate_text(pf.get('to_eligible')) if pf else 'n/a (not formal)'} | "
            f"{rate_text(pf.get('to_ineligible')) if pf else 'n/a (not formal)'} | "
            f"{rate_text(cons.get('same_decision')) if cons else 'n/a (1 run)'} | "
            f"{rate_text(same_facts) if same_facts else 'n/a'} |"
        )
    return lines


def _failures_plots_and_skipped(s: dict, skipped: list[str]) -> list[str]:
    """The closing sections: failed pairs by reason, the plots, and the input rows skipped."""
    lines: list[str] = []
    fails = [(name, reason, k) for name, b in s["backends"].items() for reason, k in b["failures"].items()]
    if fails:
        lines += section("Failed pairs by reason", "backend | reason | pairs")
        lines += [row(f) for f in fails]
    if s.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in s["plots"]]
    if skipped:
        lines += ["", "## Input rows skipped", ""] + [f"- {p}" for p in skipped[:200]]
        if len(skipped) > 200:
            lines.append(f"- ... and {len(skipped) - 200} more (results.json)")
    return lines


# ---- comparing two runs -------------------------------------------------------------------------
def load_run(path: str | Path) -> tuple[Path, dict, list[PairResult]]:
    p = Path(path)
    run_dir = p.parent if p.name == "results.json" else p
    res = run_dir / "results.json"
    if not res.is_file():
        raise BenchError(f"{run_dir}: no results.json (is it a `verdict bench run` directory?)")
    try:
        summary = json.loads(res.read_text())
    except ValueError as e:
        raise BenchError(f"{res}: not valid JSON ({e})") from None
    if not isinstance(summary, dict) or summary.get("format") != FORMAT:
        raise BenchError(f"{res}: not a {FORMAT} results file")
    return run_dir, summary, load_pairs(run_dir)


def compare_runs(path_a: str | Path, path_b: str | Path) -> str:
    """Markdown: both runs' backends side by side, then agreement and McNemar's tests between
    every backend of A and every backend of B on the pairs both scored."""
    from .bench_config import ScoringConfig
    from .chart_reading import compare_chart_reading
    from .counterfactual import compare_cf
    from .ranking_report import compare_ranking

    dir_a, a, ra = load_run(path_a)
    dir_b, b, rb = load_run(path_b)
    lines = [
        f"# `{a['name']}` vs `{b['name']}`",
        "",
        *(
            [
                f"- {tag}: {MACHINERY_CHECK}"
                for tag, x in (("A", a), ("B", b))
                if x.get("purpose") == "machinery_check"
            ]
        ),
        f"- A: {dir_a} ({a['dataset']['kind']}, {a['dataset']['pairs']} pairs, policy `{a['policy']}`)",
        f"- B: {dir_b} ({b['dataset']['kind']}, {b['dataset']['pairs']} pairs, policy `{b['policy']}`)",
        "",
        "| run | backend | scored | F1 [95% CI] | accuracy [95% CI] | pair p50/p95 ms | cost/pair | "
        "flip inel.->el. | flip el.->inel. |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tag, s in (("A", a), ("B", b)):
        for name, x in s["backends"].items():
            lat = x["latency_ms"]["pair"]
            pf = x.get("pivotal_flip_rate") or {}
            lines.append(
                f"| {tag} | {name} | {x['coverage']['scored']} | {_ci(x['metrics']['f1'])} | "
                f"{_ci(x['metrics']['accuracy'])} | {_ms(lat['p50'])}/{_ms(lat['p95'])} | "
                f"{_usd(x['cost_usd']['per_pair']) if x.get('cost_usd') else 'n/a'} | "
                f"{rate_text(pf.get('to_eligible')) if pf else 'n/a'} | "
                f"{rate_text(pf.get('to_ineligible')) if pf else 'n/a'} |"
            )
    scoring = ScoringConfig.model_validate(a.get("scoring") or {})
    by_a: dict[str, list] = defaultdict(list)
    by_b: dict[str, list] = defaultdict(list)
    for r in ra:
        by_a[r.backend].append(r)
    for r in rb:
        by_b[r.backend].append(r)
    lines += [
        "",
        "Agreement on the pairs both scored:",
        "",
        "| A backend | B backend | pairs | agreement | kappa | McNemar p (decisions) | F1 A / B | "
        "McNemar p (correctness) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for na in by_a:
        for nb in by_b:
            c = compare_backends(by_a[na], by_b[nb], scoring)
            if not c["pairs"]:
                lines.append(f"| {na} | {nb} | 0 | n/a | n/a | n/a | n/a | n/a |")
                continue
            d = c["decisions"]
            lines.append(
                f"| {na} | {nb} | {c['pairs']} | {_f(d['rate'])} | {_f(d['kappa'])} | "
                f"{_f(d['mcnemar_p'], 4)} | {_f(c['f1']['a'])} / {_f(c['f1']['b'])} | "
                f"{_f(c['correctness']['mcnemar_p'], 4)} |"
            )
    lines += compare_ranking(a, b) + compare_cf(a, b) + compare_chart_reading(a, b)
    return "\n".join(lines) + "\n"
