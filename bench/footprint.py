"""`ursa bench footprint`: a device's import time and peak memory, in fresh processes.

Each probe runs in its own ``python -c`` subprocess, so nothing the parent has
imported counts, and reports its wall time and CPU time (``time.perf_counter``
and ``time.process_time`` around the probe's body, interpreter start-up
excluded; on a loaded machine the CPU time is the steadier figure) and its
peak resident set (``VmHWM`` from ``/proc/self/status``, which includes the
interpreter's own ~10 MiB; ``ru_maxrss`` off Linux, where it would carry the
parent's peak across ``exec``). The import probes repeat ``--repeats`` times
and report the median:

    bare interpreter        ``pass``: the baseline RSS
    selection-only device   ``import ursa.edge_sdk`` (checks torch stays out)
    training device         ``import ursa.edge_sdk, ursa.edge_sdk.training``

``--steps`` adds, once each: one local training round of the demo's model
(MLP 64-128-128-10, 256 random samples, 1 epoch, batch 16; time of the round
alone) and, in a torch-free process, loading that model's ONNX export with
onnxruntime and classifying 256 samples (an ``[infer]`` device). A probe whose
extra is missing prints "not installed"; one that fails prints "FAILED: <why>"
(a crash as "the interpreter died (signal N)") and the exit status is 1.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["Probe", "ProbeResult", "run", "run_probe"]

_HARNESS = """
import json, resource, sys, time
extra = {{}}
start, cpu_start = time.perf_counter(), time.process_time()
{body}
took, cpu = time.perf_counter() - start, time.process_time() - cpu_start
try:  # VmHWM: this process's own peak (ru_maxrss keeps the parent's across exec)
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    peak_kib = int(status.split()[0])
except (OSError, IndexError):
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.platform == "darwin":
        peak_kib //= 1024
print(json.dumps({{"seconds": took, "cpu_seconds": cpu, "peak_rss_kib": peak_kib,
                  **extra}}))
"""

_TRAIN_STEP = """
import numpy as np
import ursa.edge_sdk.training as training
from ursa.models.onnx_export import export_arrays_to_onnx
from ursa.models.registry import initial_arrays
from ursa.models.weights import add_scaled
config = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [128, 128]}
rng = np.random.default_rng(0)
x = rng.random((256, 64), dtype=np.float32)
y = rng.integers(0, 10, 256)
arrays = initial_arrays("mlp", config, seed=0)
step, step_cpu = time.perf_counter(), time.process_time()
result = training.train_local(
    "mlp", config, arrays, x, y,
    config=training.TrainConfig(epochs=1, batch_size=16, lr=0.05),
)
extra["step_seconds"] = time.perf_counter() - step
extra["step_cpu_seconds"] = time.process_time() - step_cpu
onnx = export_arrays_to_onnx("mlp", config, add_scaled(arrays, result.delta, 1.0))
open(sys.argv[1], "wb").write(onnx)
"""

_ONNX_INFER = """
import numpy as np
from ursa.models.inference import OnnxClassifier
classifier = OnnxClassifier(open(sys.argv[1], "rb").read())
x = np.random.default_rng(1).random((256, 64), dtype=np.float32)
labels = classifier.logits(x).argmax(axis=1)
assert labels.shape == (256,)
assert "torch" not in sys.modules, "an inference-only device loaded torch"
"""


@dataclass(frozen=True)
class Probe:
    """A piece of code timed in a fresh interpreter."""

    label: str
    body: str
    needs: tuple[str, ...] = ()
    """Distributions it needs; missing ones skip the probe."""


@dataclass(frozen=True)
class ProbeResult:
    """A probe's median time and peak RSS (None when skipped)."""

    label: str
    seconds: float | None
    """Wall time of the probe's body (interpreter start-up excluded)."""
    cpu_seconds: float | None
    """CPU time of the body: unlike wall time, barely moved by other load."""
    peak_rss_mib: float | None
    step_seconds: float | None = None
    step_cpu_seconds: float | None = None
    skipped: str | None = None


IMPORT_PROBES = (
    Probe("bare interpreter (pass)", "pass"),
    Probe(
        "selection-only device: import ursa.edge_sdk",
        "import ursa.edge_sdk\nassert 'torch' not in sys.modules, 'torch loaded'",
    ),
    Probe(
        "training device: import ursa.edge_sdk.training",
        "import ursa.edge_sdk, ursa.edge_sdk.training",
        needs=("torch",),
    ),
)
TRAIN_STEP = Probe(
    "training device: one local round (imports + round)",
    _TRAIN_STEP,
    needs=("torch", "onnx"),
)
ONNX_INFER = Probe(
    "inference device: ONNX load + 256 samples (imports + run)",
    _ONNX_INFER,
    needs=("onnxruntime",),
)


def run_probe(
    probe: Probe, *, repeats: int = 1, args: tuple[str, ...] = ()
) -> ProbeResult:
    """Run `probe` `repeats` times in fresh interpreters; medians of its figures.

    Raises:
        RuntimeError: the probe's process failed.
    """
    missing = [name for name in probe.needs if _version(name) is None]
    if missing:
        skipped = f"{missing[0]} not installed"
        return ProbeResult(probe.label, None, None, None, skipped=skipped)
    runs = []
    for _ in range(max(1, repeats)):
        done = subprocess.run(
            [sys.executable, "-c", _HARNESS.format(body=probe.body), *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [""]
            reason = lines[-1] or f"exit status {done.returncode}"
            if done.returncode < 0:
                reason = f"the interpreter died (signal {-done.returncode})"
            stderr = done.stderr[-2000:]
            raise RuntimeError(f"{probe.label} failed:\n{stderr}\n{reason}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    has_step = "step_seconds" in runs[0]
    return ProbeResult(
        probe.label,
        statistics.median(r["seconds"] for r in runs),
        statistics.median(r["cpu_seconds"] for r in runs),
        statistics.median(r["peak_rss_kib"] for r in runs) / 1024,
        step_seconds=_median(runs, "step_seconds") if has_step else None,
        step_cpu_seconds=_median(runs, "step_cpu_seconds") if has_step else None,
    )


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)


def run(*, as_json: bool = False, repeats: int = 5, steps: bool = False) -> int:
    """Print the footprint figures (a table, or one JSON object).

    Returns:
        0, or 1 when a probe failed (its line says "FAILED: <why>").
    """
    results = [_run_or_fail(p, repeats=repeats) for p in IMPORT_PROBES]
    if steps:
        with tempfile.TemporaryDirectory() as work:
            onnx_path = str(Path(work) / "mlp.onnx")
            trained = _run_or_fail(TRAIN_STEP, args=(onnx_path,))
            results.append(trained)
            if trained.skipped is None:
                results.append(_run_or_fail(ONNX_INFER, args=(onnx_path,)))
            else:
                label = ONNX_INFER.label
                results.append(ProbeResult(label, None, None, None, skipped="no model"))
    failed = any((r.skipped or "").startswith("FAILED") for r in results)
    environment = _environment()
    if as_json:
        print(json.dumps({"environment": environment, "repeats": repeats,
                          "probes": [r.__dict__ for r in results]}))  # fmt: skip
        return 1 if failed else 0
    print(", ".join(f"{k} {v}" for k, v in environment.items()))
    print(f"import probes: median of {repeats} fresh processes; steps: one run")
    print(f"{'probe':<58} {'wall':>9} {'CPU':>9} {'peak RSS':>9}")
    for result in results:
        print(_line(result))
    return 1 if failed else 0


def _run_or_fail(
    probe: Probe, *, repeats: int = 1, args: tuple[str, ...] = ()
) -> ProbeResult:
    """`run_probe`, with a failure recorded as "FAILED: <its last line>"."""
    try:
        return run_probe(probe, repeats=repeats, args=args)
    except RuntimeError as exc:
        last = str(exc).strip().splitlines()[-1]
        return ProbeResult(probe.label, None, None, None, skipped=f"FAILED: {last}")


def _line(result: ProbeResult) -> str:
    if (
        result.skipped is not None
        or result.seconds is None
        or result.cpu_seconds is None
        or result.peak_rss_mib is None
    ):
        return f"{result.label:<58} {result.skipped}"
    figures = (
        f"{_ms(result.seconds):>9} {_ms(result.cpu_seconds):>9} "
        f"{result.peak_rss_mib:>5.0f} MiB"
    )
    if result.step_seconds is not None and result.step_cpu_seconds is not None:
        figures += (
            f"  (the round alone: {_ms(result.step_seconds)} wall, "
            f"{_ms(result.step_cpu_seconds)} CPU)"
        )
    return f"{result.label:<58} {figures}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _environment() -> dict[str, Any]:
    environment: dict[str, Any] = {
        "ursa": _version("ursa-fl"),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    for name in ("numpy", "torch", "onnxruntime"):
        environment[name] = _version(name) or "-"
    return environment


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ursa.bench.footprint")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--repeats", type=int, default=5, help="runs per median")
    parser.add_argument("--steps", action="store_true", help="train + ONNX probes")
    cli = parser.parse_args()
    sys.exit(run(as_json=cli.json, repeats=cli.repeats, steps=cli.steps))
