"""FedDisk's device state: its progress record, best MADE and sample weights.

Kept apart from the method (`ursa.edge_sdk.methods.feddisk.FedDisk`) that
decides when to save and what a restart resumes; no torch. The record (phase
and the stopper's counters) is the method's state in the device's store
(`DeviceStateDir.method_state`, as a JSON object: `record_to_json`,
`record_from_json`); the arrays are binary files beside it,
``feddisk_made.bin`` the best global MADE (phase 1) and
``feddisk_weights.npy`` the sample weights (phase 2), each replaced
atomically.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.edge_sdk.methods.feddisk.made_stopper import MadeStopper
from ursa.edge_sdk.methods.feddisk.phased_trainer import Phase
from ursa.models.weights import Arrays, arrays_from_bytes, arrays_to_bytes

__all__ = [
    "FEDDISK_MADE_FILE",
    "FEDDISK_WEIGHTS_FILE",
    "FeddiskRecord",
    "read_made",
    "read_weights",
    "record_from_json",
    "record_to_json",
    "write_made",
    "write_weights",
]

FEDDISK_WEIGHTS_FILE = "feddisk_weights.npy"
FEDDISK_MADE_FILE = "feddisk_made.bin"


@dataclass(frozen=True)
class FeddiskRecord:
    """FedDisk's progress on a device (the method's state in the store).

    Attributes:
        phase: ``"made"`` or ``"classifier"``.
        stopper: The MADE stopper (its counters are saved, not its settings).
        applied: (epoch, round, version) of the last loss sum applied.
        best_version: The best MADE's version (its weights: `read_made`).
        made_version: The MADE version the switch named (phase 2).
        weighted: Whether phase 2 has sample weights (`read_weights`).
    """

    phase: Phase
    stopper: MadeStopper
    applied: tuple[int, int, int] | None = None
    best_version: int | None = None
    made_version: int | None = None
    weighted: bool = False


def record_to_json(record: FeddiskRecord) -> dict[str, Any]:
    """The record as the JSON object the device's store keeps."""
    stopper = record.stopper
    return {
        "phase": record.phase,
        "rounds": stopper.rounds,
        "best_round": stopper.best_round,
        "best_loss": None if math.isinf(stopper.best_loss) else stopper.best_loss,
        "since_best": stopper.since_best,
        "applied": record.applied,
        "best_version": record.best_version,
        "made_version": record.made_version,
        "weighted": record.weighted,
    }


def record_from_json(data: dict[str, Any], fresh: MadeStopper) -> FeddiskRecord:
    """The record `record_to_json` wrote.

    ``fresh`` is the device's stopper before any round: the record gives its
    counters. In phase 2 only ``phase`` and ``weighted`` are read (missing
    ``weighted`` means weighted); the rest of the record keeps its defaults.

    Raises:
        ValueError, KeyError, TypeError: not such a record.
    """
    if data["phase"] == "classifier":
        weighted = bool(data.get("weighted", True))
        return FeddiskRecord("classifier", fresh, weighted=weighted)
    best_loss = data["best_loss"]
    stopper = replace(
        fresh,
        rounds=int(data["rounds"]),
        best_round=int(data["best_round"]),
        best_loss=math.inf if best_loss is None else float(best_loss),
        since_best=int(data["since_best"]),
    )
    applied: tuple[int, int, int] | None = None
    if data["applied"] is not None:
        epoch, round_index, version = (int(v) for v in data["applied"])
        applied = (epoch, round_index, version)
    best = data["best_version"]
    return FeddiskRecord("made", stopper, applied, None if best is None else int(best))


def write_made(state_dir: Path, arrays: Arrays) -> None:
    """Keep the best global MADE's weights (``feddisk_made.bin``)."""
    _write_atomic(state_dir / FEDDISK_MADE_FILE, arrays_to_bytes(arrays))


def read_made(state_dir: Path) -> Arrays:
    """The kept best global MADE.

    Raises:
        OSError, ValueError: missing or not weights.
    """
    return arrays_from_bytes((state_dir / FEDDISK_MADE_FILE).read_bytes())


def write_weights(state_dir: Path, weights: npt.NDArray[np.float64]) -> None:
    """Keep phase 2's sample weights (``feddisk_weights.npy``, no pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(weights, dtype=np.float64), allow_pickle=False)
    _write_atomic(state_dir / FEDDISK_WEIGHTS_FILE, buffer.getvalue())


def read_weights(state_dir: Path) -> npt.NDArray[np.float64]:
    """Phase 2's kept sample weights.

    Raises:
        OSError, ValueError: missing or not an ``.npy`` array.
    """
    stored = np.load(state_dir / FEDDISK_WEIGHTS_FILE)
    return np.asarray(stored, dtype=np.float64)


def _write_atomic(path: Path, payload: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(payload)
    tmp.replace(path)
