from __future__ import annotations

import numpy as np
import pytest

from ursa.tools.data.federation import (
    FederationError,
    PartitionSpec,
    build_federation,
)
from ursa.tools.data.loaders import load_digits


@pytest.fixture(scope="module")
def digits():  # type: ignore[no-untyped-def]
    return load_digits()


def test_climb_keeps_minority_classes_at_one_over_rho(digits) -> None:  # type: ignore[no-untyped-def]
    spec = PartitionSpec(
        kind="climb", num_devices=50, rho=10, alpha=0.1, num_minority=3
    )

    fed = build_federation(digits, spec, np.random.default_rng(0))

    totals = fed.counts.sum(axis=0)
    assert fed.minority_classes == (0, 1, 2)
    assert totals[3:].min() >= 9 * totals[:3].max()
    assert abs(fed.summary["rho"] - 10.0) < 1.0
    assert fed.num_devices == 50 and min(len(d.y) for d in fed.devices) > 0
    # the test set keeps the original (near-balanced) classes
    test_counts = np.bincount(fed.test_y, minlength=10)
    assert test_counts.min() >= 0.9 * test_counts.max()
    # devices hold distinct training samples
    rows = np.concatenate([d.x for d in fed.devices])
    assert len(np.unique(rows, axis=0)) >= 0.98 * len(rows)


def test_dubhe_partition_reaches_rho_and_emd(digits) -> None:  # type: ignore[no-untyped-def]
    spec = PartitionSpec(kind="dubhe", num_devices=50, rho=10, emd=1.5)
    fed = build_federation(digits, spec, np.random.default_rng(1))
    assert 8.0 < fed.summary["rho"] < 12.0
    assert 1.3 < fed.summary["emd_avg"] < 1.8
    assert fed.minority_classes == (9,)


def test_noise_partition_gives_noisier_data_to_later_devices(digits) -> None:  # type: ignore[no-untyped-def]
    spec = PartitionSpec(kind="noise", num_devices=20, noise_variance=0.3)
    fed = build_federation(digits, spec, np.random.default_rng(2))

    assert fed.devices[0].x.min() >= 0.0 and fed.devices[-1].x.max() <= 1.0
    # the first device is noise-free: its pixels are the data's 17 grey levels
    assert np.allclose(
        fed.devices[0].x * 16, np.round(fed.devices[0].x * 16), atol=1e-5
    )
    assert not np.allclose(fed.devices[-1].x * 16, np.round(fed.devices[-1].x * 16))
    assert len(fed.test_y) == fed.summary["test_samples"] > 0
    assert sum(len(d.y) for d in fed.devices) + len(fed.test_y) == len(digits)


def test_iid_and_bad_requests(digits) -> None:  # type: ignore[no-untyped-def]
    fed = build_federation(
        digits, PartitionSpec(kind="iid", num_devices=10), np.random.default_rng(0)
    )
    sizes = [len(d.y) for d in fed.devices]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(FederationError, match="unknown partition"):
        build_federation(digits, PartitionSpec(kind="zipf"), np.random.default_rng(0))
    with pytest.raises(FederationError, match="no samples"):
        build_federation(
            digits,
            PartitionSpec(kind="climb", num_devices=2000),
            np.random.default_rng(0),
        )
