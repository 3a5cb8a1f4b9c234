"""`ursa bench learning --plot`: accuracy and worst-class accuracy per round."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["mean_curves", "plot_curves"]


def mean_curves(runs: Sequence[dict[str, Any]], key: str) -> dict[str, np.ndarray]:
    """Per combination, ``key``'s per-round curve averaged over its seeds.

    Runs of one combination that stopped early are cut to the shortest.
    """
    grouped: dict[str, list[list[float]]] = {}
    for row in runs:
        grouped.setdefault(row["methods"], []).append(
            [np.nan if v is None else float(v) for v in row[key]]
        )
    out = {}
    for label, curves in grouped.items():
        length = min(len(c) for c in curves)
        if length:
            out[label] = np.nanmean([c[:length] for c in curves], axis=0)
    return out


def plot_curves(runs: Sequence[dict[str, Any]], path: Path) -> None:
    """Two panels, one line per combination (mean over seeds), saved as ``path``.

    matplotlib is imported here, with the Agg backend, so that the bench runs
    without it unless a plot is asked for.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("accuracy_per_round", "test accuracy"),
        ("worst_class_per_round", "worst-class test accuracy"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for label, curve in mean_curves(runs, key).items():
            ax.plot(np.arange(1, len(curve) + 1), curve, label=label)
        ax.set_xlabel("round")
        ax.set_title(title + " (mean over seeds)")
        ax.set_ylim(0.0, 1.0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
