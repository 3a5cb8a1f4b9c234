"""The demo's population: the bundled digits dealt out to skewed devices.

`ursa demo` and `ursa bench learning` deal the same data for a seed, so a
bench row describes the federation a user sees in the demo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ursa.tools.demo.settings import TrainingDemoSettings

if TYPE_CHECKING:
    from ursa.tools.data.federation import Federation

__all__ = ["demo_population"]


def demo_population(s: TrainingDemoSettings) -> Federation:
    """Digits dealt to ``s.devices`` devices at ``s.rho`` and ``s.emd`` for a seed.

    Raises:
        ValueError: the data cannot be dealt out so (a partition or
            federation error).
    """
    from ursa.tools.data.federation import PartitionSpec, build_federation
    from ursa.tools.data.loaders import load_dataset

    spec = PartitionSpec(
        kind="dubhe",
        num_devices=s.devices,
        rho=s.rho,
        emd=s.emd,
        test_fraction=s.test_fraction,
    )
    return build_federation(
        load_dataset("digits"), spec, np.random.default_rng([s.seed, 0])
    )
