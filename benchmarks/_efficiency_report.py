"""What `hpo_efficiency.py` compares, and what it prints and plots of the results.

The methods searched side by side, the peer whose final quality hpo must reach, the summary
of the rows (one per seed and method) the benchmark's JSON holds, its tables and its plot.
"""

from __future__ import annotations

from typing import Any

from benchmarks import _search_curves as curves
from benchmarks._common import table

METHODS = ("hpo", "hf", "optuna_mlflow", "random")
PEER = "hf"  # the method whose final quality hpo must reach in a third of its time


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's keys: per method final loss (mean, spread), fit share, ratio, compute share."""
    out: dict[str, Any] = {
        "final_loss": {},
        "fit_share": {},
        "infeasible_compute_share": {},
        "infeasible_trained_share": {},
        "search_seconds": {},
        "search_spent_over_budget": {},
    }
    for method in _methods(rows):
        mine = [r for r in rows if r["method"] == method]
        losses = [r["final_loss"] for r in mine if r["final_loss"] is not None]
        out["final_loss"][method] = curves.mean_and_spread(losses)
        out["fit_share"][method] = sum(r["fits"] for r in mine) / len(mine)
        seconds = sum(r["trial_seconds"] for r in mine)
        for key in ("infeasible_compute_share", "infeasible_trained_share"):
            out[key][method] = (
                sum(r[key] * r["trial_seconds"] for r in mine) / seconds
                if seconds
                else 0.0
            )
        out["search_seconds"][method] = curves.mean_and_spread([r["search_seconds"] for r in mine])
        out["search_spent_over_budget"][method] = curves.mean_and_spread(
            [r["search_spent_over_budget"] for r in mine]
        )
    per_seed = [r["time_to_peer_best_ratio"] for r in rows if r["method"] == "hpo"]
    out["time_to_peer_best_ratio"] = {
        "median": curves.median_or_none(per_seed),
        "per_seed": per_seed,
    }
    return out


def print_table(summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    headers = [
        "method", "full-run loss", "sd", "fit share", "search s", "infeasible share",
        "of it trained",
    ]  # fmt: skip
    lines = []
    for method in _methods(rows):
        loss = summary["final_loss"][method]
        lines.append(
            [
                method,
                _num(loss["mean"]),
                _num(loss["sd"]),
                f"{summary['fit_share'][method]:.0%}",
                _num(summary["search_seconds"][method]["mean"], ".0f"),
                f"{summary['infeasible_compute_share'][method]:.1%}",
                f"{summary['infeasible_trained_share'][method]:.1%}",
            ]
        )
    print(table(headers, lines))
    ratio = summary["time_to_peer_best_ratio"]
    print(
        f"time_to_peer_best_ratio (hpo vs {PEER}): median {ratio['median']}, per seed {ratio['per_seed']}"
    )
    per = [
        [r["seed"], r["method"], r["trials"], _num(r["final_loss"]), r["fits"], _num(r["time_to_peer_best_seconds"], ".0f")]
        for r in rows
    ]  # fmt: skip
    print(table(["seed", "method", "trials", "full-run loss", "fits", "reaches peer at s"], per))


def _methods(rows: list[dict[str, Any]]) -> list[str]:
    return [m for m in METHODS if any(r["method"] == m for r in rows)]


def _num(value: float | None, spec: str = ".4f") -> str:
    return "n/a" if value is None else format(value, spec)


def plot(rows: list[dict[str, Any]], path: str, window_seconds: float) -> None:
    """The pick's full-run loss over search time, one panel per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({r["seed"] for r in rows})
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.5 * len(seeds), 3.6), squeeze=False)
    for ax, seed in zip(axes[0], seeds, strict=True):
        for row in (r for r in rows if r["seed"] == seed):
            points = row["curve"]
            if not points:
                continue
            xs = [t for t, _ in points] + [row["search_seconds"]]
            ys = [loss for _, loss in points] + [points[-1][1]]
            ax.step(xs, ys, where="post", label=row["method"], marker="o", markersize=3)
        ax.set_title(f"seed {seed} (window {window_seconds:.0f} s)")
        ax.set_xlabel("search time (s)")
        ax.set_ylabel("pick's full-run val loss")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
