"""The run's plots (PNG, matplotlib's Agg backend: no display needed): per-backend F1 with its
95% CI, latency and cost per pair, and one confusion matrix per backend."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(summary: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    backends = summary["backends"]
    names = list(backends)
    paths = []

    # F1 with bootstrap CIs (and published reference points as dashed lines)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 2), 3.6))
    vals = [backends[n]["metrics"]["f1"]["value"] or 0.0 for n in names]
    lo = [v - (backends[n]["metrics"]["f1"]["ci95"] or [v, v])[0] for n, v in zip(names, vals)]
    hi = [(backends[n]["metrics"]["f1"]["ci95"] or [v, v])[1] - v for n, v in zip(names, vals)]
    ax.bar(range(len(names)), vals, yerr=[lo, hi], capsize=4, color="#4C72B0")
    for p in summary.get("reference_points", []):
        if p.get("f1") is not None:
            ax.axhline(p["f1"], ls="--", lw=1, color="#C44E52")
            ax.text(
                len(names) - 0.5,
                p["f1"],
                f" {p['label']}",
                va="bottom",
                ha="right",
                fontsize=7,
                color="#C44E52",
            )
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("F1 (95% bootstrap CI)")
    ax.set_title(f"{summary['name']}: F1 per backend", fontsize=9)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / "f1.png", plt))

    # latency (p50 bar, p95 whisker) and cost per pair
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(6.0, 2.0 * len(names) + 3), 3.6))
    p50 = [backends[n]["latency_ms"]["pair"]["p50"] or 0.0 for n in names]
    p95 = [backends[n]["latency_ms"]["pair"]["p95"] or 0.0 for n in names]
    a1.bar(
        range(len(names)),
        p50,
        yerr=[[0] * len(names), [max(0.0, b - a) for a, b in zip(p50, p95)]],
        capsize=4,
        color="#55A868",
    )
    a1.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    a1.set_ylabel("ms per pair (p50, whisker to p95)")
    a1.set_title("latency per pair", fontsize=9)
    cost = [(backends[n].get("cost_usd") or {}).get("per_pair") or 0.0 for n in names]
    a2.bar(range(len(names)), cost, color="#8172B2")
    a2.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    a2.set_ylabel("USD per pair")
    a2.set_title("cost per pair", fontsize=9)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / "latency_cost.png", plt))

    # confusion matrices
    fig, axes = plt.subplots(1, len(names), figsize=(2.8 * len(names) + 0.4, 3.0), squeeze=False)
    for ax, n in zip(axes[0], names):
        c = backends[n]["metrics"]["confusion"]
        grid = [[c["tp"], c["fn"]], [c["fp"], c["tn"]]]
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=max(1, max(max(row) for row in grid)))
        top = max(1, max(max(row) for row in grid))
        for i in range(2):
            for j in range(2):
                ax.text(
                    j,
                    i,
                    str(grid[i][j]),
                    ha="center",
                    va="center",
                    fontsize=11,
                    color="white" if grid[i][j] > top / 2 else "black",
                )
        ax.set_xticks([0, 1], ["pred. elig.", "pred. inel."], fontsize=7)
        ax.set_yticks([0, 1], ["eligible", "ineligible"], fontsize=7)
        ax.set_title(n, fontsize=8)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / "confusion.png", plt))
    return paths


def _save(fig, path: Path, plt) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
