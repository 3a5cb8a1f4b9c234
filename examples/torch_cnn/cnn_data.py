"""Write and read the example's data files: a slice of scikit-learn's digits.

``python cnn_data.py data --devices 3`` writes ``data/device-<i>.npz`` (arrays
``x``: ``(n, 1, 8, 8)`` float32 in [0, 1], ``y``: int64 labels) with a
skewed split (each device holds mostly a few classes, and some of all) and
``data/test.npz``.
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
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    test, train = order[:300], order[300 : 300 + devices * per_device]
    out.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(_skewed_split(train, y, devices, rng)):
        np.savez(out / f"device-{index}.npz", x=x[part], y=y[part])
    np.savez(out / "test.npz", x=x[test], y=y[test])


def _skewed_split(
    train: NDArray[np.int64],
    y: NDArray[np.int64],
    devices: int,
    rng: np.random.Generator,
) -> list[NDArray[np.int64]]:
    """Per device: a run of classes (60% of its samples) plus a uniform share."""
    uniform = rng.random(len(train)) < 0.4
    skewed = train[~uniform][np.argsort(y[train[~uniform]], kind="stable")]
    return [
        np.concatenate([s, u])
        for s, u in zip(
            np.array_split(skewed, devices),
            np.array_split(train[uniform], devices),
            strict=True,
        )
    ]


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
