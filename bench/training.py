"""`ursa bench training`: a device's peak memory while training, its bytes per round.

Memory is measured in a fresh subprocess (so the parent's imports, e.g.
scikit-learn for the data, do not count): the parent takes the largest
device of `ursa demo`'s default partition (digits, 20 devices, rho 10,
EMD 1.5) and hands its samples over in an ``.npz`` file; the child imports
only what a training device imports (torch, ursa's training module), trains
one round of the demo's default model and settings (MLP 64-128-128-10, 5
epochs, batch 4, SGD 0.1) from seeded initial weights, evaluates CLIMB's
local loss, and reports ``ru_maxrss`` (its peak resident set, `resource`)
and its resident set after the imports (``/proc/self/status``).

Bytes are the msgpack envelopes a device publishes in one round of the demo
(Dubhe with H tries, CLIMB): `Volunteer`, `EncryptedDistribution` (when in a
try), CLIMB's `MeanReport` (every device, every dual step) and, when selected,
`ModelUpdate` with the delta inline, as float32 and as float16; and what it
receives per round: the new global model (manifest + chunks).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ursa.bench.common import Budget, report
from ursa.models.weights import WireDtype

KEY_BITS = 2048
HIDDEN = (128, 128)
EPOCHS, BATCH, LR = 5, 4, 0.1

BUDGETS = [
    Budget("peak_rss_mib", at_most=600.0),
    Budget("bytes_sent_selected_round_float32", at_most=256 * 1024),
    Budget("bytes_sent_selected_round_float16", at_most=128 * 1024),
]
"""A Raspberry Pi 3 has 1 GiB; one inline update stays under one 256 KiB chunk."""


def _child(data_file: str) -> None:
    """In the subprocess: train one default round, print peak memory as JSON."""
    import resource

    from ursa.edge_sdk.training import TrainConfig, evaluate_loss, train_local
    from ursa.models.registry import initial_arrays

    after_import = _status_mib("VmRSS")
    with np.load(data_file) as data:
        x, y = data["x"], data["y"]
    config = {"input_dim": x.shape[1], "num_classes": 10, "hidden_sizes": HIDDEN}
    arrays = initial_arrays("mlp", config, seed=0)
    started = time.perf_counter()
    result = train_local(
        "mlp", config, arrays, x, y,
        config=TrainConfig(epochs=EPOCHS, batch_size=BATCH, lr=LR),
    )  # fmt: skip
    train_s = time.perf_counter() - started
    evaluate_loss("mlp", config, arrays, x, y)
    # VmHWM is this process's own high-water mark; ru_maxrss can carry the
    # parent's size across fork + exec (a large pytest parent inflates it).
    peak = _status_mib("VmHWM")
    if peak != peak:  # NaN: no /proc (not Linux)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(
        json.dumps(
            {
                "peak_rss_mib": peak,
                "rss_after_import_mib": after_import,
                "train_round_s": train_s,
                "device_samples": len(y),
                "optimiser_steps": result.num_steps,
            }
        )
    )


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MiB."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def measure_memory() -> dict[str, Any]:
    """Train one round in a fresh interpreter and return its figures."""
    from ursa.tools.data.federation import PartitionSpec, build_federation
    from ursa.tools.data.loaders import load_dataset

    fed = build_federation(
        load_dataset("digits"),
        PartitionSpec(kind="dubhe", num_devices=20, rho=10.0, emd=1.5),
        np.random.default_rng([0, 0]),
    )
    device = max(fed.devices, key=lambda d: len(d.y))
    with tempfile.TemporaryDirectory(prefix="ursa-bench-") as tmp:
        data_file = Path(tmp) / "device.npz"
        np.savez(data_file, x=device.x, y=device.y)
        code = f"from ursa.bench.training import _child; _child({str(data_file)!r})"
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def measure_bytes(key_bits: int = KEY_BITS) -> dict[str, Any]:
    """Envelope sizes of one round's device messages (real ciphertexts)."""
    from ursa.crypto.paillier import encrypt_reals, generate_keypair
    from ursa.edge_sdk.methods.climb.dual import ClimbConfig, encrypt_dual_report
    from ursa.edge_sdk.registration import DISTRIBUTION_CODEC
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_to_bytes
    from ursa.protocol.chunking import split
    from ursa.protocol.envelope import encode
    from ursa.protocol.messages import (
        CLIMB_DUAL,
        EncryptedDistribution,
        MeanReport,
        ModelUpdate,
        Volunteer,
    )

    public_key, _ = generate_keypair(key_bits)
    fed, me = "demo", "dev000"
    config = {"input_dim": 64, "num_classes": 10, "hidden_sizes": HIDDEN}
    delta = initial_arrays("mlp", config, seed=0)
    volunteer = encode(Volunteer(federation=fed, round=1, sender=me, draws=(True,) * 5))
    dist = encrypt_reals(public_key, DISTRIBUTION_CODEC, 8, np.full(10, 0.1))
    distribution = encode(
        EncryptedDistribution(
            federation=fed, round=1, sender=me, distribution=dist.to_bytes(public_key)
        )
    )
    report_vector = encrypt_dual_report(public_key, ClimbConfig(), 0.7, 0.0)
    climb = encode(
        MeanReport(
            federation=fed,
            round=1,
            sender=me,
            purpose=CLIMB_DUAL,
            epoch=1,
            model="mlp",
            model_version=0,
            ciphertext=report_vector.to_bytes(public_key),
        )
    )
    updates = {}
    dtypes: tuple[WireDtype, ...] = ("float32", "float16")
    for dtype in dtypes:
        payload = arrays_to_bytes(delta, dtype=dtype)
        updates[dtype] = len(
            encode(
                ModelUpdate(
                    federation=fed,
                    round=1,
                    sender=me,
                    base_version=0,
                    num_examples=38,
                    delta_scaled=True,
                    weights=payload,
                )
            )
        )
    manifest, chunks = split(
        arrays_to_bytes(delta), purpose="classifier.v1", federation=fed, round=1,
        sender="coordinator",
    )  # fmt: skip
    model_in = len(encode(manifest)) + sum(len(encode(c)) for c in chunks)
    base = len(volunteer) + len(distribution) + len(climb)
    return {
        "key_bits": key_bits,
        "bytes_volunteer": len(volunteer),
        "bytes_encrypted_distribution": len(distribution),
        "bytes_climb_stats": len(climb),
        "bytes_update_float32": updates["float32"],
        "bytes_update_float16": updates["float16"],
        "bytes_sent_selected_round_float32": base + updates["float32"],
        "bytes_sent_selected_round_float16": base + updates["float16"],
        "bytes_sent_unselected_round": base,
        "bytes_received_model_per_round": model_in,
    }


def run(*, as_json: bool, key_bits: int = KEY_BITS) -> int:
    """Measure, print, and return 1 if a budget is missed."""
    figures: dict[str, Any] = {}
    figures.update(measure_memory())
    figures.update(measure_bytes(key_bits))
    return report(
        "ursa bench training (device: default demo model and round)",
        figures,
        BUDGETS,
        as_json=as_json,
    )
