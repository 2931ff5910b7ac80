"""The ranking part of a run's results and report (bench/ranking.py computes it): every backend's
order of each topic's judged trials, the BM25 floor, the tie spread, and the peers' published
figures beside them with the setting named (a machinery check shows no published figure)."""

from __future__ import annotations

from collections import defaultdict

from . import ranking as R
from .markdown import section, side_by_side, table
from .protocol import PairResult


def ranking_section(config, dataset, results: list[PairResult]) -> dict | None:
    rc = config.ranking
    if not rc.enabled:
        return None
    b, seed = config.scoring.bootstrap_b, config.scoring.seed
    by_backend: dict[str, list[PairResult]] = defaultdict(list)
    for r in results:
        by_backend[r.backend].append(r)
    rows = {}
    for bc in config.backends:
        rs = by_backend.get(bc.name, [])
        summary = R.backend_ranking(bc.kind, rs, b, seed, rc.tie_orders)
        if summary is not None:
            only = [r for r in rs if r.repeat == 0 and r.ranking_only]
            summary["ranking_only_pairs"] = len(only)
            summary["ranking_only_cost_usd"] = sum(
                s.cost_usd for r in only for s in r.stages.values() if not s.shared
            )
        rows[bc.name] = summary
    if rc.bm25:
        rows["bm25 (lexical baseline)"] = R.bm25_ranking(dataset, b, seed, rc.tie_orders)
    missing = len(dataset.ranking_pairs) * len(config.backends) - sum(
        1 for r in results if r.repeat == 0 and r.ranking_only
    )
    return {
        "setting": R.SETTING.format(
            what="including the not-relevant (score 0) ones"
            if dataset.ranking_pairs
            else "the dataset's labelled pairs only"
        ),
        "ranking_only_pairs": len(dataset.ranking_pairs),
        "ranking_only_missing": max(0, missing),
        "tie_break": "trial id (the screen's rule)",
        "tie_orders": rc.tie_orders,
        "backends": rows,
        "peers": R.PEERS,
    }


def _m(x: dict, m: str) -> str:
    v = x["metrics"].get(m)
    if v is None:
        return "n/a"
    ci = (x.get("ci95") or {}).get(m)
    return f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{v:.3f}"


def _spread(x: dict, m: str) -> str:
    sp = (x.get("tie_spread") or {}).get(m)
    return "n/a" if not sp else f"{sp['mean']:.3f} ({sp['min']:.3f}-{sp['max']:.3f})"


def render_ranking(s: dict, machinery_check: bool) -> list[str]:
    rk = s.get("ranking")
    if not rk:
        return []
    ties = (
        f"Ties broken by {rk['tie_break']}; 'over random tie orders': mean (min-max) of the metric over "
        f"{rk['tie_orders']} random orders of the tied trials. 95% CIs: bootstrap over topics. nDCG@10 "
        "with linear gains (2 eligible, 1 excluded, 0 not relevant; binary labels: 2 eligible, "
        "0 ineligible); P@10 and recall count eligible trials."
    )
    columns = (
        "backend | ranks by | topics (single-candidate, left out) | pairs (eligible) | median candidates "
        "| nDCG@10 [95% CI] | P@10 [95% CI] | recall@10 [95% CI] | recall@20 [95% CI] | tied pairs | "
        "nDCG@10 over tie orders | P@10 over tie orders"
    )
    lines = section("Ranking", columns, [rk["setting"], ties])
    short = False
    for name, x in rk["backends"].items():
        if x is None:
            lines.append(f"| {name} | n/a | 0 | 0 | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |")
            continue
        if "error" in x:
            lines.append(f"| {name} | n/a: {x['error']} | | | | | | | | | | |")
            continue
        short = short or (x["median_candidates"] or 0) <= 10
        lines.append(
            f"| {name} | {R.RANKS_BY_TEXT[x['ranks_by']]} | {x['topics']} ({x['single_candidate_topics']}) | "
            f"{x['pairs']} ({x['eligible']}) | {x['median_candidates'] or 'n/a'} | "
            f"{_m(x, 'ndcg@10')} | {_m(x, 'p@10')} | {_m(x, 'recall@10')} | {_m(x, 'recall@20')} | "
            f"{x['tied_pairs']} | {_spread(x, 'ndcg@10')} | {_spread(x, 'p@10')} |"
        )
    if short:
        lines += [
            "",
            "With 10 or fewer candidates a topic's P@10 and recall@10 do not depend on the order: "
            "only nDCG@10 measures the ranking there.",
        ]
    if rk.get("ranking_only_pairs"):
        lines += [
            "",
            f"{rk['ranking_only_pairs']} not-relevant (score 0) pairs were decided for the ranking only "
            "(never scored as decisions); their calls are not in the cost table above.",
        ]
    if machinery_check:
        lines += ["", "Machinery check: no published ranking figure is set beside these."]
    else:
        lines += [
            "",
            "Published figures (not measured here; TREC Clinical Trials, their own setting):",
            "",
            *table("source | nDCG@10 | P@10"),
        ]
        for p in rk["peers"]:
            nd, pk = (("n/a" if p.get(m) is None else f"{p[m]:.3f}") for m in ("ndcg@10", "p@10"))
            lines.append(f"| {p['label']} | {nd} | {pk} |")
        lines.append(f"\n{rk['setting']}")
    return lines


def compare_ranking(a: dict, b: dict) -> list[str]:
    """Both runs' ranking rows side by side."""
    columns = (
        "backend | ranks by | topics | nDCG@10 [95% CI] | P@10 [95% CI] | recall@10 | recall@20 | "
        "nDCG@10 over tie orders"
    )
    title = "Ranking (re-ranking each topic's judged trials):"
    return side_by_side(a, b, "ranking", title, columns, _compared_rows)


def _compared_rows(rk: dict) -> list[list]:
    """A run's ranking rows as `verdict bench compare` shows them (a backend without figures left out)."""
    return [
        [
            name,
            x["ranks_by"],
            x["topics"],
            _m(x, "ndcg@10"),
            _m(x, "p@10"),
            _m(x, "recall@10"),
            _m(x, "recall@20"),
            _spread(x, "ndcg@10"),
        ]
        for name, x in (rk.get("backends") or {}).items()
        if x and "error" not in x
    ]
