"""The report of `ursa demo`: JSON, PNG plots and the final model as checked ONNX.

`write_report` puts into the report folder (default ``./ursa-report``)::

    report.json     everything `build_report` returns (also `--json`'s output)
    accuracy.png    test accuracy per round, overall and per class
    selection.png   ||p_o - p_u||_1 of each round's participants vs random K
    devices.png     bytes sent / received and crypto time per device
    model.onnx      the final global model (ONNX, for onnxruntime devices)

`onnx_check` exports the final arrays with torch (the ``train`` extra) and
runs both torch and onnxruntime on the held-out test split: ``identical`` is
true when every prediction agrees. Plots use matplotlib's Agg backend (no
display); without matplotlib the PNGs are skipped and the JSON says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.models.weights import Arrays
from ursa.tools.demo.fleet import DeviceReport

__all__ = ["json_safe", "onnx_check", "report_of", "summarise_devices", "write_report"]


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (strict JSON)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def onnx_check(
    architecture: str,
    model_config: Mapping[str, Any],
    arrays: Arrays,
    x: npt.NDArray[np.float32],
) -> tuple[dict[str, Any], bytes]:
    """Export to ONNX and compare onnxruntime with torch on ``x``."""
    from ursa.models.onnx_check import checked_onnx

    onnx_bytes, check = checked_onnx(architecture, model_config, arrays, x)
    return check, onnx_bytes


def summarise_devices(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means and maxima of the per-device cost figures."""
    if not reports:
        return {}
    crypto = np.array([r["crypto_ms"] for r in reports])
    sent = np.array([r["bytes_sent"] for r in reports])
    received = np.array([r["bytes_received"] for r in reports])
    return {
        "crypto_ms_mean": float(crypto.mean()),
        "crypto_ms_max": float(crypto.max()),
        "bytes_sent_mean": float(sent.mean()),
        "bytes_sent_max": int(sent.max()),
        "bytes_received_mean": float(received.mean()),
        "bytes_received_max": int(received.max()),
    }


def write_report(
    report: dict[str, Any], folder: Path, onnx_bytes: bytes | None
) -> list[str]:
    """Write the JSON, plots and ONNX model; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    if onnx_bytes is not None:
        (folder / "model.onnx").write_bytes(onnx_bytes)
        written.append("model.onnx")
    try:
        written += _plots(report, folder)
    except ImportError:
        report["plots"] = "skipped: matplotlib is not installed"
    files = ["summary.md", *written, "report.json"]
    report["files"] = files
    (folder / "summary.md").write_text(summary_markdown(report))
    text = json.dumps(json_safe(report), indent=2, allow_nan=False)
    (folder / "report.json").write_text(text + "\n")
    return files


def summary_markdown(report: dict[str, Any]) -> str:
    """The page to open first: the settings, the figures and what they mean."""
    settings = report.get("settings", {})
    rounds = report.get("rounds", [])
    lines = [
        "# ursa demo",
        "",
        f"Methods: {', '.join(report.get('methods', []))}. "
        + ", ".join(
            f"{k} {v}" for k, v in settings.items() if _plain(v) and k != "report_dir"
        )
        + ".",
        "",
        "| figure | value | |",
        "|---|---|---|",
    ]
    rows = [
        (
            "final accuracy (held-out test split)",
            report.get("final_accuracy"),
            "higher is better",
        ),
        (
            f"worst class (class {report.get('worst_class')}) accuracy",
            report.get("worst_class_accuracy"),
            "higher is better: what skew costs",
        ),
        (
            "mean ‖p_o - p_u‖₁ of the selected K",
            report.get("mean_l1_to_uniform"),
            "lower is better: 0 is a perfectly balanced class mix",
        ),
        (
            "the same for K drawn at random",
            report.get("random_selection_l1_to_uniform"),
            "the reference the selection method beats (or not)",
        ),
        ("rounds completed", len(rounds), ""),
        ("wall time, s", report.get("elapsed_s"), ""),
    ]
    for name, value, note in rows:
        if value is not None:
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            lines.append(f"| {name} | {shown} | {note} |")
    selected, random = (
        report.get("mean_l1_to_uniform"),
        report.get("random_selection_l1_to_uniform"),
    )
    if isinstance(selected, float) and isinstance(random, float) and random > 0:
        gain = 100 * (1 - selected / random)
        how = f"{gain:.0f}% closer to" if gain >= 0 else f"{-gain:.0f}% further from"
        lines += [
            "",
            f"The selection brought the participants' class mix {how} uniform "
            "than random selection would (the same devices, the same K). An "
            "accuracy reference (random selection, FedAvg) needs a second run: "
            "`ursa demo --methods random,fedavg` with the same seed.",
        ]
    lines += [
        "",
        "Files: `report.json` (every figure), `accuracy.png` (overall and worst "
        "class), `selection.png` (class balance per round), `model.onnx` (the "
        "final model).",
        "",
    ]
    return "\n".join(lines)


def _plain(value: Any) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)


def _plots(report: dict[str, Any], folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rounds = report["rounds"]
    xs = [r["round"] for r in rounds]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    per_class = np.array([r["per_class_accuracy"] for r in rounds], dtype=float)
    worst = report.get("worst_class")
    for c in range(per_class.shape[1] if per_class.ndim == 2 else 0):
        if c != worst:
            ax.plot(xs, per_class[:, c], color="0.8", linewidth=0.7)
    if isinstance(worst, int) and per_class.ndim == 2:
        ax.plot(
            xs, per_class[:, worst], "r-", linewidth=1.8, label=f"worst: class {worst}"
        )
    ax.plot(xs, [r["accuracy"] for r in rounds], "k-", linewidth=2.5, label="overall")
    ax.plot([], [], color="0.8", linewidth=0.7, label="other classes")
    ax.set(xlabel="round", ylabel="test accuracy", ylim=(0, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    settings = report.get("settings", {})
    ax.set_title(
        f"{', '.join(report.get('methods', []))}: {settings.get('devices')} devices, "
        f"K={settings.get('k')}, seed {settings.get('seed')} (held-out test split)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(folder / "accuracy.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(xs, [r["l1_to_uniform"] for r in rounds], "o-", label="selected K")
    baseline = report.get("random_selection_l1_to_uniform")
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", label="random K (mean)")
    ax.set(xlabel="round", ylabel="||p_o - p_u||_1 (lower is better)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(
        f"class balance of the participants ({report['settings']['selection']})"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "selection.png", dpi=110)
    plt.close(fig)

    devices = report["devices"]
    names = [d["device_id"] for d in devices]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    pos = np.arange(len(names))
    top.bar(pos - 0.2, [d["bytes_sent"] / 1024 for d in devices], 0.4, label="sent")
    top.bar(
        pos + 0.2, [d["bytes_received"] / 1024 for d in devices], 0.4, label="received"
    )
    top.set(ylabel="KiB")
    top.legend()
    bottom.bar(pos, [d["crypto_ms"] for d in devices], 0.6, color="tab:red")
    bottom.set(ylabel="crypto ms")
    bottom.set_xticks(pos, names, rotation=90, fontsize=7)
    fig.suptitle("cost per device")
    fig.tight_layout()
    fig.savefig(folder / "devices.png", dpi=110)
    plt.close(fig)
    return ["accuracy.png", "selection.png", "devices.png"]


def report_of(device: DeviceReport) -> dict[str, Any]:
    """A device's figures for the JSON report."""
    data = asdict(device)
    data.pop("flicker", None)
    data["crypto_ms"] = 1000.0 * data.pop("crypto_s")
    data["train_ms"] = 1000.0 * data.pop("train_s")
    data["selected_rounds"] = list(device.selected_rounds)
    return data
