"""The cap simulator: the coordinator's own cap bounds a device that always says yes."""

from __future__ import annotations

import numpy as np

from ursa.coordinator.methods.dubhe.participation import ParticipationCap
from ursa.lab.simulate.selection_cap import capped_rounds
from ursa.tools.data.metrics import distributions
from ursa.tools.data.partition import dubhe_partition


def test_the_cap_holds_the_cheater_and_every_device_to_its_share() -> None:
    p = distributions(
        dubhe_partition(60, 10, 10.0, 1.5, np.random.default_rng(0)).counts
    )
    free = capped_rounds(p, k=6, tries=3, rounds=60, seed=0, cheater=0)
    capped = capped_rounds(
        p, k=6, tries=3, rounds=60, seed=0, cheater=0, cap=ParticipationCap(0.5, 10)
    )
    assert free.counts[0] > 40  # it is in every try: nearly always selected
    assert capped.counts[0] <= 30 and capped.counts.max() <= 30
    assert capped.counts.sum() == free.counts.sum() == 60 * 6
    assert free.distances.shape == (60,) and np.isfinite(capped.mean_distance)
