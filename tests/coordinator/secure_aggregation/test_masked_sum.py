from __future__ import annotations

from pathlib import Path

import numpy as np

from ursa.coordinator.secure_aggregation.masked_sum import MaskedSum


def test_a_checkpoint_gives_back_the_sum_and_who_is_in_it(tmp_path: Path) -> None:
    total = np.random.default_rng(0).integers(0, 2**32, 1000, dtype=np.uint32)
    saved = MaskedSum(4, 7, total, {"dev-1", "dev-2"})
    path = tmp_path / "masked-r4.npz"
    path.write_bytes(saved.to_bytes())

    loaded = MaskedSum.from_file(path)

    assert (loaded.round, loaded.version) == (4, 7)
    assert loaded.contributors == {"dev-1", "dev-2"}
    assert loaded.total.dtype == np.uint32
    np.testing.assert_array_equal(loaded.total, total)
