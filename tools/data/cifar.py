"""CIFAR-10 python batches, read with an unpickler that resolves only what they need.

Unpickling an untrusted file runs arbitrary code; the batches are pickles, so
`RestrictedUnpickler` resolves names from a fixed table and refuses the rest.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ursa.tools.data.datasets import (
    Dataset,
    DatasetError,
    IndexArray,
    dataset_from_arrays,
    labels_from,
)

__all__ = ["CIFAR_CLASSES", "RestrictedUnpickler", "load_cifar10_batches"]

CIFAR_PIXELS = 3 * 32 * 32  # one row: 1024 red, 1024 green, 1024 blue
CIFAR_CLASSES = 10
CIFAR_SUBDIR = "cifar-10-batches-py"

# CIFAR-10 python batches are pickles. Unpickling runs whatever callables the
# file names, so a planted "data_batch_1" could run code (os.system, ...). The
# restricted unpickler resolves only the names a CIFAR batch needs, from a fixed
# table (nothing is imported or looked up by name): numpy's array
# reconstruction, `ndarray` and `dtype`, a few plain builtins, and `_codecs.encode`
# limited to latin-1 (how Python 3 writes bytes at protocol 2). Everything else
# raises before it is called. What remains possible is a memory-exhaustion
# attempt (e.g. a huge array shape); only load files of a sane size.
_ARRAY_PROBE = np.zeros(1, dtype=np.uint8)
_RECONSTRUCT = _ARRAY_PROBE.__reduce__()[0]  # numpy's array reconstruction
_FROMBUFFER = _ARRAY_PROBE.__reduce_ex__(5)[0]  # its protocol-5 variant


def _latin1_encode(text: object, encoding: object = "latin1") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is allowed only for latin-1")
    return text.encode("latin-1")


_SAFE_BUILTINS = {"dict": dict, "list": list, "bytes": bytes, "str": str, "int": int}
_ALLOWED_GLOBALS: dict[tuple[str, str], object] = {
    **{
        (mod, n): f
        for mod in ("builtins", "__builtin__")
        for n, f in _SAFE_BUILTINS.items()
    },
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("_codecs", "encode"): _latin1_encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals a CIFAR batch needs."""

    def find_class(self, module: str, name: str) -> Any:
        """Return the allowed object for `module.name`; refuse everything else."""
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name} from a data file"
            ) from None


def _load_cifar_batch(path: Path) -> tuple[npt.NDArray[np.uint8], IndexArray]:
    try:
        with path.open("rb") as fh:
            batch = RestrictedUnpickler(fh, encoding="bytes").load()
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: no such CIFAR-10 batch") from exc
    except Exception as exc:  # a garbled pickle can raise almost any error
        raise DatasetError(f"{path}: not a CIFAR-10 python batch: {exc}") from exc
    if not isinstance(batch, dict):
        raise DatasetError(f"{path}: a CIFAR-10 batch is a dict, got {type(batch)}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise DatasetError(f"{path}: b'data' must be a uint8 N x 3072 array")
    if data.shape[1] != CIFAR_PIXELS or not isinstance(labels, list):
        raise DatasetError(
            f"{path}: expected b'data' N x {CIFAR_PIXELS} and a b'labels' list, "
            f"got data {data.shape} and labels {type(labels).__name__}"
        )
    if len(labels) != len(data):
        raise DatasetError(f"{path}: {len(data)} images but {len(labels)} labels")
    return data, labels_from(labels, f"{path}: b'labels'")


def load_cifar10_batches(
    directory: str | Path, *, split: Literal["train", "test", "all"] = "train"
) -> Dataset:
    """Load CIFAR-10 python batches (`data_batch_1..5`, `test_batch`), safely.

    Args:
        directory: the folder holding the batches (or its parent holding
            `cifar-10-batches-py/`).
        split: `"train"` (the five data batches), `"test"` or `"all"`.

    Returns:
        Images `(N, 3, 32, 32)` in [0, 1], labels 0..9. Files are read with
        `RestrictedUnpickler`, which refuses any global a batch does not need.
    """
    root = Path(directory)
    if not (root / "test_batch").exists() and (root / CIFAR_SUBDIR).is_dir():
        root = root / CIFAR_SUBDIR
    names = [f"data_batch_{i}" for i in range(1, 6)] if split != "test" else []
    names += ["test_batch"] if split != "train" else []
    batches = [_load_cifar_batch(root / n) for n in names]
    data = np.concatenate([d for d, _ in batches])
    labels = np.concatenate([y for _, y in batches])
    if labels.max() >= CIFAR_CLASSES:
        raise DatasetError(f"{root}: CIFAR-10 label {labels.max()} is not in 0..9")
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255.0)
    return dataset_from_arrays(x, labels, "cifar10", num_classes=CIFAR_CLASSES)
