"""Global model checkpoints on the coordinator: versioned files written atomically.

Layout under ``<state_dir>/models/<model>/``::

    v000000.ursw          version 0: the initial weights (`ursa.models.weights`
                          bytes, float32), imported from the operator's file
    v000012.ursw          one file per version, the last `keep` kept
    latest.json           {"version", "round", "sha256", "size", "file"}
    round-000013.npz      the running sum of an open round (restart resume)

Every file is written to a temporary name in the same directory, flushed,
fsync'ed and renamed over the old one, then the directory is fsync'ed, so a
crash leaves either the old or the new file, never a torn one. ``latest.json``
is written after the version's file: a version is never announced before its
weights are on disk. The initial weights come from a file the operator makes
with the ``train`` extra (torch), because the coordinator has no torch:
``ursa model init`` (`ursa.tools.cli.model.write_initial_weights`) or
``arrays_to_bytes(initial_arrays(...))``.

No version that holds NaN or inf, or whose arrays differ from the model's
(names, shapes), is ever written or loaded: `ModelStore.save`,
`ModelStore.load_arrays` and `ModelStore.import_initial` check it
(`check_model`, `UnsafeModelError`), so nothing the coordinator publishes or
hands out at the end can be such a model.

These files are model artefacts (megabytes of weights an operator may copy
or inspect), so they stay files; everything else the coordinator keeps (the
phases of a round, methods' progress) is in its one SQLite store
(`ursa.coordinator.store`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from ursa.coordinator.aggregation import (
    AggregationPolicy,
    AggregationRule,
    AggregationState,
    Weighting,
)
from ursa.models.spec import tensor_spec
from ursa.models.weights import Arrays, arrays_from_bytes, arrays_to_bytes, spec_of
from ursa.protocol.messages import ModelSpec

__all__ = [
    "DEFAULT_KEEP_VERSIONS",
    "ModelStore",
    "ModelStoreError",
    "ModelVersion",
    "UnsafeModelError",
    "check_model",
    "signed_spec",
    "write_atomic",
]

logger = logging.getLogger("ursa.coordinator")

DEFAULT_KEEP_VERSIONS = 5
LATEST = "latest.json"
_VERSION_FILE = re.compile(r"^v(\d{6,})\.ursw$")


class ModelStoreError(ValueError):
    """A checkpoint that is missing, corrupt or does not fit the model."""


class UnsafeModelError(ModelStoreError):
    """A model that holds NaN or inf, or does not fit the model's arrays."""


def check_model(arrays: Arrays, like: Arrays | None = None) -> None:
    """Refuse a model no one may train from or be handed.

    Every float array must be finite (float32 overflow shows as inf), and with
    ``like`` the names and shapes must be the same.

    Raises:
        UnsafeModelError: the first array that is not.
    """
    if like is not None and spec_of(arrays) != spec_of(like):
        raise UnsafeModelError(
            f"the model's arrays changed: {spec_of(arrays)[:3]} ..., the model "
            f"has {spec_of(like)[:3]} ..."
        )
    for name, array in arrays.items():
        values = np.asarray(array)
        if values.dtype.kind not in "fiub":
            raise UnsafeModelError(f"array {name!r} is not numbers ({values.dtype})")
        if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
            bad = int(np.size(values) - np.count_nonzero(np.isfinite(values)))
            raise UnsafeModelError(f"array {name!r} holds {bad} NaN or inf values")


def signed_spec(model: str, arrays: Arrays) -> ModelSpec | None:
    """The tensor spec of ``model`` at ``arrays``, for `KeyEpochStart.model_spec`.

    None (logged) for a model past the spec's bounds: devices then check a
    model only when they download it.
    """
    try:
        return ModelSpec.of(model, tensor_spec(arrays))
    except ValidationError as exc:
        logger.warning(
            "%s: the model's tensor spec is not signed into the key epochs "
            "(devices check their model at the first download instead): %s",
            model,
            exc.errors()[0]["msg"],
        )
        return None


@dataclass(frozen=True)
class ModelVersion:
    """One stored global model version."""

    model: str
    version: int
    round: int
    sha256: str
    size: int
    path: Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ModelStore:
    """The versions of one global model (``model``) under ``root/models/model``."""

    def __init__(self, root: Path, model: str, *, keep: int = DEFAULT_KEEP_VERSIONS):
        """Use (and create, 0700) the model's directory."""
        if keep < 1:
            raise ModelStoreError(f"keep must be >= 1, got {keep}")
        self.model = model
        self.keep = keep
        self.path = Path(root) / "models" / model
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)

    # --- versions -------------------------------------------------------------

    def latest(self) -> ModelVersion | None:
        """The newest saved version, or None before the initial weights."""
        pointer = self.path / LATEST
        if not pointer.exists():
            return None
        try:
            data = json.loads(pointer.read_text())
            return ModelVersion(
                self.model,
                int(data["version"]),
                int(data["round"]),
                str(data["sha256"]),
                int(data["size"]),
                self.path / str(data["file"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelStoreError(f"{pointer} is corrupt: {exc}") from None

    def load_bytes(self, version: ModelVersion) -> bytes:
        """The weight bytes of a version, checked against its sha256.

        Raises:
            ModelStoreError: the file is missing or does not match its sha256.
        """
        try:
            data = version.path.read_bytes()
        except OSError as exc:
            raise ModelStoreError(f"cannot read {version.path}: {exc}") from None
        if hashlib.sha256(data).hexdigest() != version.sha256:
            raise ModelStoreError(f"{version.path} does not match its sha256")
        return data

    def load_arrays(self, version: ModelVersion) -> Arrays:
        """The arrays of a version (float32).

        Raises:
            UnsafeModelError: the version holds NaN or inf (an older ursa saved it).
        """
        arrays = arrays_from_bytes(self.load_bytes(version))
        check_model(arrays)
        return arrays

    def save(
        self,
        version: int,
        arrays: Arrays,
        *,
        round_index: int,
        like: Arrays | None = None,
    ) -> ModelVersion:
        """Checkpoint ``arrays`` as ``version`` (made by ``round_index``), atomically.

        ``like``: the version it was made from (its arrays must match).

        Raises:
            ModelStoreError: ``version`` is not newer than the latest one.
            UnsafeModelError: the model holds NaN or inf or does not fit ``like``
                (nothing is written).
        """
        current = self.latest()
        if current is not None and version <= current.version:
            raise ModelStoreError(
                f"version {version} is not newer than {current.version}"
            )
        check_model(arrays, like)
        data = arrays_to_bytes(arrays)
        name = f"v{version:06d}.ursw"
        write_atomic(self.path / name, data)
        saved = ModelVersion(
            self.model,
            version,
            round_index,
            hashlib.sha256(data).hexdigest(),
            len(data),
            self.path / name,
        )
        pointer = {
            "version": version,
            "round": round_index,
            "sha256": saved.sha256,
            "size": saved.size,
            "file": name,
        }
        write_atomic(self.path / LATEST, json.dumps(pointer).encode())
        self._prune(version)
        return saved

    def import_initial(self, weights_file: Path) -> ModelVersion:
        """Adopt a weights file as version 0 (no-op if a version exists).

        Raises:
            ModelStoreError: the file is unreadable or not `ursa.models.weights`.
            UnsafeModelError: it holds NaN or inf.
        """
        current = self.latest()
        if current is not None:
            return current
        try:
            arrays = arrays_from_bytes(Path(weights_file).read_bytes())
        except (OSError, ValueError) as exc:
            raise ModelStoreError(
                f"initial weights {weights_file} unusable: {exc}"
            ) from None
        return self.save(0, arrays, round_index=0)

    def _prune(self, newest: int) -> None:
        for path in self.path.iterdir():
            match = _VERSION_FILE.match(path.name)
            if match and int(match.group(1)) <= newest - self.keep:
                path.unlink(missing_ok=True)

    # --- open rounds (restart resume) -----------------------------------------

    def _partial_path(self, round_index: int) -> Path:
        return self.path / f"round-{round_index:06d}.npz"

    def save_partial(
        self, round_index: int, base_version: int, state: AggregationState
    ) -> None:
        """Checkpoint an open round's running sum (after each accepted update)."""
        policy = state.policy
        meta = {
            "round": round_index,
            "base_version": base_version,
            "weighting": state.weighting.value,
            "total_weight": state.total_weight,
            "device_ids": sorted(state.device_ids),
            "names": list(state.weighted_sum),
            "rule": policy.rule.value,
            "clip_norm": policy.clip_norm,
            "max_examples": policy.max_examples,
            "trim_fraction": policy.trim_fraction,
            "rows": len(state.rows),
        }
        arrays: dict[str, Any] = {
            f"a{i}": np.asarray(a) for i, a in enumerate(state.weighted_sum.values())
        }
        for j, row in enumerate(state.rows):
            for i, name in enumerate(state.weighted_sum):
                arrays[f"r{j}_{i}"] = np.asarray(row[name])
        arrays["meta"] = np.array(json.dumps(meta))
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        write_atomic(self._partial_path(round_index), buffer.getvalue())

    def load_partial(
        self, round_index: int, base_version: int
    ) -> AggregationState | None:
        """The running sum saved for this round and base version, if any."""
        path = self._partial_path(round_index)
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                if meta["base_version"] != base_version:
                    return None
                names = meta["names"]
                sums = {
                    name: np.array(data[f"a{i}"], dtype=np.float64)
                    for i, name in enumerate(names)
                }
                rows = tuple(
                    {
                        name: np.array(data[f"r{j}_{i}"], dtype=np.float64)
                        for i, name in enumerate(names)
                    }
                    for j in range(int(meta.get("rows", 0)))
                )
                policy = AggregationPolicy(
                    AggregationRule(meta.get("rule", "mean")),
                    meta.get("clip_norm"),
                    meta.get("max_examples"),
                    float(meta.get("trim_fraction", 0.1)),
                )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelStoreError(f"{path} is corrupt: {exc}") from None
        return AggregationState(
            Weighting(meta["weighting"]),
            sums,
            float(meta["total_weight"]),
            frozenset(meta["device_ids"]),
            policy,
            rows,
        )

    def clear_round(self, round_index: int) -> None:
        """Remove an aggregated round's running sum."""
        with contextlib.suppress(FileNotFoundError):
            self._partial_path(round_index).unlink()
