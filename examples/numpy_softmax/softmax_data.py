"""Write and read the example's CSV files: a slice of scikit-learn's digits.

``python softmax_data.py data --devices 3`` writes ``data/device-<i>.csv``
(one sample per row: 64 pixel values in [0, 1], then the label) with a
skewed split (mostly a few classes, and some of all), and ``data/test.csv``.
Nothing is downloaded.
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
    x, y = digits.data / 16.0, digits.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    test, train = order[:300], order[300 : 300 + devices * per_device]
    out.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(_skewed_split(train, y, devices, rng)):
        _save(out / f"device-{index}.csv", x[part], y[part])
    _save(out / "test.csv", x[test], y[test])


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


def _save(path: Path, x: NDArray[np.float64], y: NDArray[np.int64]) -> None:
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", fmt="%.6g")


def read(path: Path) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The samples and labels of one file (the label is the last column)."""
    table = np.loadtxt(path, delimiter=",", ndmin=2)
    return table[:, :-1].astype(np.float32), table[:, -1].astype(np.int64)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=3)
    args = parser.parse_args()
    write(args.out, args.devices)
