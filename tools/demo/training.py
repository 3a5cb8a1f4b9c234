"""`ursa demo`: broker, coordinator and N device processes learning on digits.

What runs (all on this machine):

* a broker: the embedded amqtt one (``--broker mqtt://host:port`` for another);
* the coordinator service in this process, with the `TrainingPlugin`
  (FedAvg, or CLIMB over Paillier, or FedDisk: MADE rounds with an encrypted
  fleet validation loss first, then weighted classifier rounds) and an evaluation
  callback that scores every new global model on the held-out test split
  (torch, here in the harness; the service itself never imports torch);
* N devices, each an `EdgeClient` + `TorchTrainer` in its own process,
  forked from one forkserver that imported torch and the SDK once
  (`ursa.tools.demo.devices`; ``--processes`` groups them when memory is
  short), each enrolling as soon as it is up, holding its
  share of the training split, partitioned with Dubhe's global imbalance
  (rho, average EMD). The test split never leaves the harness.

Selection ``dubhe`` is the real protocol (agent key, encrypted registries, H
tries); ``random`` is the same protocol with a one-slot codebook (G = {C}),
so every device volunteers with P = K/N and the coordinator trims or tops up
uniformly, and one try: a uniform K-subset per round. The harness (not the
coordinator, which sees no label distribution) computes each round's
``||p_o - p_u||_1`` from the partition it made.

``--balance flicker`` runs FLICKER among the device processes before the
first round (`ursa.tools.demo.flicker`): each device then trains on its
resampled training view; the report gains a ``flicker`` section.

Defaults (measured on 2 cores: see docs/tutorials/demo.md): 20 devices, K = 8, H = 5,
25 rounds, MLP 64-128-128-10, 5 local epochs, batch 4, SGD lr 0.1, 2048-bit
Paillier keys, CLIMB eta_D = 0.1, eps = 0.002, a dual step every round.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from ursa.tools.demo.settings import TrainingDemoSettings

__all__ = ["run_training_demo"]


def run_training_demo(
    settings: TrainingDemoSettings,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    as_json: bool = False,
) -> dict[str, Any]:
    """Run the demo, write the report folder, print a summary (or the JSON)."""
    import json

    from ursa.tools.demo.report import json_safe
    from ursa.tools.demo.run import DemoRun, Progress

    settings.check()
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    progress = Progress(err, settings.rounds)
    with tempfile.TemporaryDirectory(prefix="ursa-demo-") as tmp:
        run = DemoRun(settings, Path(tmp), progress)
        report = run.execute()
    if as_json:
        out.write(json.dumps(json_safe(report), allow_nan=False) + "\n")
    else:
        _print_summary(out, report)
    return report


def _print_summary(out: TextIO, report: dict[str, Any]) -> None:
    final = report.get("final_accuracy")
    devices = report.get("device_summary", {})
    onnx = report.get("onnx_check") or {}
    delivered = report.get("final_model_delivered") or {}
    lines = [
        f"rounds completed: {len(report['rounds'])}/{report['settings']['rounds']}"
        + ("" if report["completed"] else "  (NOT all rounds completed)"),
        "final test accuracy: "
        + ("-" if final is None else f"{final:.4f}")
        + f"  worst class {report.get('worst_class')} "
        f"({_fmt(report.get('worst_class_accuracy'))})",
        "per class: "
        + " ".join(_fmt(a, 2) for a in report.get("per_class_accuracy") or []),
        f"mean ||p_o - p_u||_1: {_fmt(report.get('mean_l1_to_uniform'), 3)} "
        f"(random K: {_fmt(report.get('random_selection_l1_to_uniform'), 3)})",
        f"per device: crypto {_fmt(devices.get('crypto_ms_mean'), 1)} ms, sent "
        f"{_fmt(devices.get('bytes_sent_mean', 0) / 1024, 1)} KiB, received "
        f"{_fmt(devices.get('bytes_received_mean', 0) / 1024, 1)} KiB",
        f"ONNX vs torch on the test split: identical={onnx.get('identical')} "
        f"(max |logit diff| {_fmt(onnx.get('max_abs_logit_diff'), 6)})",
        *_federated_eval_lines(report.get("federated_eval")),
        f"final model saved on {delivered.get('devices', '-')}/"
        f"{delivered.get('of', '-')} devices",
        *_flicker_lines(report.get("flicker")),
        *_feddisk_lines(report.get("feddisk")),
        f"report: {report['report_dir']} ({', '.join(report.get('files', []))})",
        f"wall time {report['wall_s']:.1f} s",
    ]
    out.write("\n".join(lines) + "\n")


def _federated_eval_lines(section: dict[str, Any] | None) -> list[str]:
    if not section or not section.get("round"):
        return []
    pairs = zip(
        section["round"], section["accuracy"], section["server_accuracy"], strict=True
    )
    return [
        "federated evaluation (devices' own data, encrypted) vs server test split: "
        + ", ".join(
            f"round {r}: {_fmt(fed)} vs {_fmt(server)}" for r, fed, server in pairs
        )
    ]


def _flicker_lines(section: dict[str, Any] | None) -> list[str]:
    if section is None:
        return []
    return [
        f"FLICKER {section['phase']}: GI {_fmt(section.get('gi_before'))} -> "
        f"{_fmt(section.get('gi_after'))} ({section.get('stop_reason')}), "
        f"+{section.get('samples_added', 0)} / -{section.get('samples_removed', 0)} "
        f"samples, {section['wall_s']:.1f} s"
    ]


def _feddisk_lines(section: dict[str, Any] | None) -> list[str]:
    if section is None:
        return []
    return [
        f"FedDisk: {section['made_rounds']} MADE rounds (best version "
        f"{section['best_made_version']}), then classifier rounds from round "
        f"{section['switch_round']}; {section['effective_rounds']} rounds in all"
    ]


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
