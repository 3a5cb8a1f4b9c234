"""Loaders for the data set files a user already has; nothing is ever downloaded.

Formats: scikit-learn's bundled digits, MNIST/EMNIST IDX (optionally gzipped),
LEAF/FEMNIST JSON, CIFAR-10 python batches, `.npz` and CSV. Every loader returns
a `Dataset` (float32 features, int64 labels) and raises `DatasetError` with the
file and the problem on a missing, truncated or garbled file. Pixel formats are
scaled to [0, 1]; `.npz` and CSV features are cast to float32 unchanged.
`load_dataset(spec)` picks a loader from a short string for the CLI.
"""

from __future__ import annotations

import csv
import gzip
import json
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.tools.data.cifar import RestrictedUnpickler, load_cifar10_batches
from ursa.tools.data.datasets import (
    Dataset,
    DatasetError,
    IndexArray,
    dataset_from_arrays,
    labels_from,
)

__all__ = [
    "RestrictedUnpickler",
    "load_cifar10_batches",
    "load_csv",
    "load_dataset",
    "load_dataset_with_partition",
    "load_digits",
    "load_leaf_json",
    "load_mnist_idx",
    "load_npz",
]

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions (N, rows, cols)
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension (N,)
FEMNIST_FEATURES = 28 * 28

SPEC_FORMS = (
    "digits | mnist:IMAGES,LABELS | mnist:DIR | emnist:IMAGES,LABELS | leaf:PATH"
    " | cifar10:DIR | cifar10-test:DIR | npz:PATH | csv:PATH"
)


def load_digits() -> Dataset:
    """Return scikit-learn's bundled 8x8 digits (1,797 images), pixels in [0, 1]."""
    try:
        from sklearn.datasets import load_digits as sklearn_load_digits
    except ImportError as exc:
        raise DatasetError(
            "the bundled digits data set needs scikit-learn: pip install 'ursa-fl[sim]'"
        ) from exc
    bunch = sklearn_load_digits()
    x = np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)  # pixels 0..16
    y = labels_from(bunch.target, "digits")
    return dataset_from_arrays(x, y, "digits", num_classes=10, input_shape=(1, 8, 8))


def _read_maybe_gzipped(path: str | Path) -> bytes:
    """Return a file's bytes, gunzipped when it starts with the gzip magic."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError as exc:
        raise DatasetError(f"{p}: no such file") from exc
    except OSError as exc:
        raise DatasetError(f"{p}: cannot read: {exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DatasetError(f"{p}: corrupt or truncated gzip: {exc}") from exc
    return raw


def _parse_idx(path: str | Path, magic: int, kind: str) -> npt.NDArray[np.uint8]:
    raw = _read_maybe_gzipped(path)
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise DatasetError(
            f"{path}: IDX magic number is {found}, expected {magic} ({kind})"
        )
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    size = int(np.prod(dims, dtype=np.int64))
    if size == 0:
        raise DatasetError(f"{path}: IDX header has an empty dimension {dims}")
    if len(raw) - header != size:
        raise DatasetError(
            f"{path}: IDX header promises {size} bytes of {kind} {dims}, "
            f"the file holds {len(raw) - header} (truncated or garbled)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_mnist_idx(
    images_path: str | Path,
    labels_path: str | Path,
    *,
    transpose: bool = False,
    num_classes: int | None = None,
    name: str = "mnist",
) -> Dataset:
    """Load MNIST/EMNIST IDX files (plain or .gz); pixels scaled to [0, 1].

    Args:
        images_path: IDX3 images (magic 2051), unsigned bytes `N x rows x cols`.
        labels_path: IDX1 labels (magic 2049), `N` unsigned bytes.
        transpose: swap rows and columns (EMNIST stores images transposed).
        num_classes: class count; default the largest label + 1 (EMNIST
            letters are labelled 1..26, so class 0 stays empty).
        name: the data set's name.
    """
    images = _parse_idx(images_path, IDX_IMAGES_MAGIC, "images")
    labels = _parse_idx(labels_path, IDX_LABELS_MAGIC, "labels")
    if len(images) != len(labels):
        raise DatasetError(
            f"{images_path} holds {len(images)} images but {labels_path} holds "
            f"{len(labels)} labels"
        )
    if transpose:
        images = images.transpose(0, 2, 1)
    x = images.astype(np.float32) / np.float32(255.0)
    _, rows, cols = images.shape
    y = labels_from(labels, str(labels_path))
    return dataset_from_arrays(
        x, y, name, num_classes=num_classes, input_shape=(1, rows, cols)
    )


def _read_leaf_file(path: Path) -> list[tuple[str, list[Any], list[Any]]]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: no such file") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable LEAF JSON file: {exc}") from exc
    if not isinstance(doc, dict) or not {"users", "user_data"} <= doc.keys():
        raise DatasetError(f"{path}: LEAF JSON needs 'users' and 'user_data' keys")
    users, user_data = doc["users"], doc["user_data"]
    num_samples = doc.get("num_samples")
    if not isinstance(users, list) or not isinstance(user_data, dict):
        raise DatasetError(f"{path}: 'users' must be a list, 'user_data' an object")
    if num_samples is not None and (
        not isinstance(num_samples, list) or len(num_samples) != len(users)
    ):
        raise DatasetError(f"{path}: 'num_samples' must list one count per user")
    records: list[tuple[str, list[Any], list[Any]]] = []
    for i, user in enumerate(users):
        entry = user_data.get(user) if isinstance(user, str) else None
        if not isinstance(entry, dict) or not {"x", "y"} <= entry.keys():
            raise DatasetError(f"{path}: user {user!r} has no 'x' and 'y' in user_data")
        if not isinstance(entry["y"], list) or not isinstance(entry["x"], list):
            raise DatasetError(f"{path}: user {user!r}: 'x' and 'y' must be lists")
        if num_samples is not None and num_samples[i] != len(entry["y"]):
            raise DatasetError(
                f"{path}: user {user!r}: num_samples says {num_samples[i]}, "
                f"y has {len(entry['y'])}"
            )
        records.append((user, entry["x"], entry["y"]))
    return records


def load_leaf_json(
    path: str | Path,
    *,
    num_classes: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    name: str = "leaf",
) -> tuple[Dataset, dict[str, IndexArray]]:
    """Load LEAF JSON (one file or a directory of `*.json`) and its per-user split.

    Each file holds `{"users": [...], "num_samples": [...], "user_data": {user:
    {"x": [[floats]], "y": [ints]}}}`; features must be numeric vectors of one
    length (FEMNIST: 784 values, shaped `(1, 28, 28)` unless `input_shape` says
    otherwise). A user found in several files keeps all of its samples.

    Returns:
        The data set and the natural partition: user -> indices into it.
    """
    root = Path(path)
    files = sorted(root.glob("*.json")) if root.is_dir() else [root]
    if not files:
        raise DatasetError(f"{root}: directory holds no *.json LEAF files")
    xs: list[npt.NDArray[np.float32]] = []
    ys: list[IndexArray] = []
    owners: dict[str, list[IndexArray]] = {}
    offset = 0
    for file in files:
        for user, x_raw, y_raw in _read_leaf_file(file):
            where = f"{file}: user {user!r}"
            try:
                x = np.asarray(x_raw, dtype=np.float32)
            except (ValueError, TypeError) as exc:
                raise DatasetError(f"{where}: x is not numeric vectors: {exc}") from exc
            y = labels_from(y_raw, where) if y_raw else np.zeros(0, np.int64)
            if x.shape[0] != len(y) or (len(y) and x.ndim != 2):
                raise DatasetError(
                    f"{where}: x has shape {x.shape} for {len(y)} labels"
                )
            if xs and len(y) and x.shape[1:] != xs[0].shape[1:]:
                raise DatasetError(
                    f"{where}: {x.shape[1]} features, earlier users have "
                    f"{xs[0].shape[1]}"
                )
            if len(y):
                xs.append(x)
                ys.append(y)
            owners.setdefault(user, []).append(np.arange(offset, offset + len(y)))
            offset += len(y)
    if not xs:
        raise DatasetError(f"{root}: LEAF data holds no samples")
    x_all = np.concatenate(xs)
    shape = input_shape
    if shape is None:
        feats = x_all.shape[1]
        shape = (1, 28, 28) if feats == FEMNIST_FEATURES else (feats,)
    dataset = dataset_from_arrays(
        x_all, np.concatenate(ys), name, num_classes=num_classes, input_shape=shape
    )
    partition = {
        u: np.concatenate(parts).astype(np.int64) for u, parts in owners.items()
    }
    return dataset, partition


def load_npz(path: str | Path, x_key: str = "x", y_key: str = "y") -> Dataset:
    """Load features and labels from a `.npz` archive (never unpickles objects)."""
    p = Path(path)
    try:
        # np.load is given an open file so that a failed parse cannot leak it.
        with p.open("rb") as fh:
            archive = np.load(fh, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise DatasetError(f"{p}: expected an .npz archive, not an .npy")
            keys = sorted(archive.files)
            if x_key not in keys or y_key not in keys:
                raise DatasetError(
                    f"{p}: needs arrays {x_key!r} and {y_key!r}, has {keys}"
                )
            x, y_raw = archive[x_key], archive[y_key]
    except FileNotFoundError as exc:
        raise DatasetError(f"{p}: no such file") from exc
    except DatasetError:
        raise
    except (OSError, ValueError, EOFError, zlib.error, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{p}: not a readable .npz archive: {exc}") from exc
    if x.dtype.kind not in "iufb" or x.ndim < 2:
        raise DatasetError(
            f"{p}: {x_key!r} must be a numeric array of shape (N, ...), got "
            f"{x.dtype} {x.shape}"
        )
    return dataset_from_arrays(x, labels_from(y_raw, f"{p}: {y_key!r}"), p.stem)


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def load_csv(
    path: str | Path,
    label_column: str | int = "label",
    *,
    has_header: bool | None = None,
    delimiter: str = ",",
) -> Dataset:
    """Load a CSV of numeric features plus one label column.

    Args:
        path: the CSV file.
        label_column: the label column's header name, or its index (negative
            counts from the end). A file without a header needs an index.
        has_header: whether the first row names the columns; default: detected
            (a first row with any non-numeric field is a header).
        delimiter: the field separator.
    """
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:  # -sig: drop a BOM
            rows = [row for row in csv.reader(fh, delimiter=delimiter) if row]
    except FileNotFoundError as exc:
        raise DatasetError(f"{p}: no such file") from exc
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{p}: not a readable CSV file: {exc}") from exc
    if not rows:
        raise DatasetError(f"{p}: empty CSV file")
    if has_header is None:
        has_header = not all(_is_number(field) for field in rows[0])
    header = [h.strip() for h in rows[0]] if has_header else None
    body = rows[1:] if has_header else rows
    width = len(rows[0])
    if isinstance(label_column, str):
        if header is None:
            raise DatasetError(
                f"{p}: no header row, so label_column must be an index (e.g. 0)"
            )
        if label_column not in header:
            raise DatasetError(f"{p}: no column {label_column!r} in header {header}")
        col = header.index(label_column)
    elif -width <= label_column < width:
        col = label_column % width
    else:
        raise DatasetError(f"{p}: label_column {label_column} outside {width} columns")
    if not body or width < 2:
        raise DatasetError(f"{p}: needs data rows with a label and >= 1 feature")
    for line, row in enumerate(body, start=2 if has_header else 1):
        if len(row) != width:
            raise DatasetError(f"{p}: row {line} has {len(row)} fields, not {width}")
    try:
        table = np.array(body, dtype=np.float64)
    except ValueError as exc:
        raise DatasetError(f"{p}: non-numeric field: {exc}") from exc
    y = labels_from(table[:, col], f"{p}: label column")
    return dataset_from_arrays(np.delete(table, col, axis=1), y, p.stem)


def _standard_mnist_files(directory: Path) -> tuple[Path, Path]:
    found = []
    for kind in ("images-idx3", "labels-idx1"):
        names = [f"train-{kind}-ubyte", f"train-{kind.replace('-', '.')}-ubyte"]
        candidates = [directory / (n + gz) for n in names for gz in ("", ".gz")]
        match = next((c for c in candidates if c.is_file()), None)
        if match is None:
            raise DatasetError(f"{directory}: no {names[0]}[.gz] file")
        found.append(match)
    return found[0], found[1]


def load_dataset_with_partition(
    spec: str,
) -> tuple[Dataset, dict[str, IndexArray] | None]:
    """Load from a CLI spec (see `SPEC_FORMS`); LEAF also returns its user split."""
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "digits" and not arg:
        return load_digits(), None
    if not arg or kind == "digits":
        raise DatasetError(f"cannot read data set spec {spec!r}; use {SPEC_FORMS}")
    if kind in ("mnist", "emnist"):
        if "," in arg:
            images, _, labels = arg.partition(",")
            pair = (Path(images), Path(labels))
        elif Path(arg).is_dir():
            pair = _standard_mnist_files(Path(arg))
        else:
            raise DatasetError(f"{kind} needs IMAGES,LABELS or a directory: {spec!r}")
        transpose = kind == "emnist"
        return load_mnist_idx(*pair, transpose=transpose, name=kind), None
    if kind == "leaf":
        return load_leaf_json(arg)
    if kind in ("cifar10", "cifar10-test"):
        test = kind == "cifar10-test"
        return load_cifar10_batches(arg, split="test" if test else "train"), None
    if kind == "npz":
        return load_npz(arg), None
    if kind == "csv":
        return load_csv(arg), None
    raise DatasetError(f"unknown data set kind {kind!r} in {spec!r}; use {SPEC_FORMS}")


def load_dataset(spec: str) -> Dataset:
    """Load a data set from a CLI spec such as `"digits"` or `"npz:data.npz"`."""
    return load_dataset_with_partition(spec)[0]
