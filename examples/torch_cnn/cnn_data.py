"""Write and read the example's data files: a slice of scikit-learn's digits.

``python cnn_data.py data --devices 3`` writes ``data/device-<i>.npz`` (arrays
``x``: ``(n, 1, 8, 8)`` float32 in [0, 1], ``y``: int64 labels) with a
skewed split (each device holds mostly a few classes) and ``data/test.npz``.
The digits ship with scikit-learn: nothing is downloaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from numpy.typing import NDArray


def write(out: Path, devices: int = 3, *, per_device: int = 300, seed: int = 0) -> None:
    """Write ``devices`` skewed training files and one test file into ``out``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    test, train = order[:300], order[300 : 300 + devices * per_device]
    by_label = train[np.argsort(y[train], kind="stable")]
    out.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(np.array_split(by_label, devices)):
        np.savez(out / f"device-{index}.npz", x=x[part], y=y[part])
    np.savez(out / "test.npz", x=x[test], y=y[test])


def read(path: Path) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The samples and labels of one file."""
    with np.load(path, allow_pickle=False) as data:
        return data["x"].astype(np.float32), data["y"].astype(np.int64)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=3)
    args = parser.parse_args()
    write(args.out, args.devices)
