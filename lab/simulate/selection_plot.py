"""Participation-rate sweep (Dubhe Fig. 9) and class-proportion plots (Fig. 10)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ursa.lab.simulate.selection import SelectionSimConfig, evaluate, make_population
from ursa.lab.simulate.selection_sums import PLAINTEXT, SumBackend
from ursa.tools.data.metrics import distance_to_uniform, distributions

DEFAULT_SWEEP_RATES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""Participation rates K/N of the sweep (Dubhe Fig. 9 spans 10/1000 to 1000/1000)."""
_GREEDY_SWEEP_BUDGET = 20_000_000


def participation_sweep(
    config: SelectionSimConfig,
    rates: Sequence[float] = DEFAULT_SWEEP_RATES,
    *,
    rounds: int = 100,
    backend: SumBackend = PLAINTEXT,
) -> dict[str, Any]:
    """Mean and std of ``||p_o - p_u||_1`` per method as K/N varies (Fig. 9).

    One population; sigma is searched again at each K (the paper re-runs the
    search when the participation rate changes). Dubhe is reported at H=1 and
    at the largest H of ``config.tries``. Greedy, whose cost grows with K, runs
    fewer rounds at large K (it varies little from round to round).
    """
    p = distributions(make_population(config).counts)
    n, c = p.shape
    h_max = max(config.tries)
    tries = (1,) if h_max == 1 else (1, h_max)
    ks = sorted({min(n, max(1, round(rate * n))) for rate in rates})
    out: dict[str, Any] = {
        "k": ks,
        "rate": [k / n for k in ks],
        "baseline": float(distance_to_uniform(p.mean(axis=0))),
        "methods": {},
    }
    for k in ks:
        cfg = replace(config, k=k, rounds=rounds, tries=tries)
        budget = max(1, _GREEDY_SWEEP_BUDGET // (k * n * c))
        result = evaluate(p, cfg, greedy_rounds=budget, backend=backend)
        rows = {"random": result["random"], "greedy": result["greedy"]}
        for key in ("dubhe", "dubhe_stratified"):
            for h, stats in result.get(key, {}).items():
                rows[f"{key}_{h}"] = stats
        for name, stats in rows.items():
            entry = out["methods"].setdefault(name, {"mean": [], "std": []})
            entry["mean"].append(stats["mean"])
            entry["std"].append(stats["std"])
    return out


def plot_selection(
    report: Mapping[str, Any], path: str, sweep: Mapping[str, Any] | None = None
) -> None:
    """Plot mean class proportions per method (Fig. 10) and, given, the sweep (Fig. 9).

    matplotlib is imported here, with the Agg backend, so that nothing else in
    the simulator needs it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    props: Mapping[str, Sequence[float]] = report["class_proportions"]
    panels = 2 if sweep is not None else 1
    fig, axes = plt.subplots(panels, 1, figsize=(11, 4.2 * panels), squeeze=False)
    ax = axes[0][0]
    names = list(props)
    c = len(props["global"])
    width = 0.85 / len(names)
    x = np.arange(c)
    for i, name in enumerate(names):
        ax.bar(x + (i - (len(names) - 1) / 2) * width, props[name], width, label=name)
    ax.axhline(1.0 / c, color="black", linestyle="--", linewidth=1, label="uniform")
    ax.set_xlabel("class")
    ax.set_ylabel("mean population proportion")
    pop = report["population"]
    ax.set_title(
        f"Per-class population proportion (N={pop['num_clients']}, "
        f"K={report['config']['k']}, rho={pop['rho']:.2f}, "
        f"EMD_avg={pop['emd_avg']:.3f})"
    )
    ax.legend(fontsize=7, ncol=4)
    if sweep is not None:
        ax = axes[1][0]
        methods: Mapping[str, Mapping[str, Sequence[float]]] = sweep["methods"]
        ks = sweep["k"]
        xs = np.arange(len(ks))
        width = 0.85 / len(methods)
        for i, (name, stats) in enumerate(methods.items()):
            ax.bar(
                xs + (i - (len(methods) - 1) / 2) * width,
                stats["mean"],
                width,
                yerr=stats["std"],
                capsize=2,
                label=name,
            )
        ax.axhline(
            sweep["baseline"],
            color="black",
            linestyle="--",
            linewidth=1,
            label="||p_g - p_u||_1",
        )
        ax.set_xticks(xs, [f"{k}/{report['population']['num_clients']}" for k in ks])
        ax.set_xlabel("participation rate K/N")
        ax.set_ylabel("||p_o - p_u||_1 (mean, std)")
        ax.set_title("Data unbiasedness vs participation rate")
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
