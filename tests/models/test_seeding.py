from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch")

from ursa.models.registry import initial_arrays
from ursa.models.seeding import torch_seeded

CONFIG = {"input_dim": 16, "num_classes": 4, "hidden_sizes": [8]}


def test_seeded_builds_in_threads_give_the_single_threaded_weights() -> None:
    expected = initial_arrays("mlp", CONFIG, seed=7)
    mismatches: list[int] = []

    def build(worker: int) -> None:
        for _ in range(20):
            got = initial_arrays("mlp", CONFIG, seed=7)
            if any(not np.array_equal(got[k], expected[k]) for k in expected):
                mismatches.append(worker)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "seeded builds deadlocked"
    assert mismatches == []


def test_a_seeded_block_may_build_a_seeded_model_inside_it() -> None:
    with torch_seeded(1):  # re-entrant: the registry seeds again inside
        inner = initial_arrays("mlp", CONFIG, seed=7)
    assert all(
        np.array_equal(inner[k], v)
        for k, v in initial_arrays("mlp", CONFIG, seed=7).items()
    )
