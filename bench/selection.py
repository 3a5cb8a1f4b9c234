"""`ursa bench selection`: Dubhe selection rounds per second at N = 100,000.

A round is what happens after registration, every round: each device computes
eq. (6) from the overall registry and flips its coin, and the coordinator trims
or tops up to exactly K. Registration (Algorithm 1 and the registry sum) runs
once per key epoch and is timed separately. The stratified draw's round and a
20-try round are reported beside it, without a budget.
"""

from __future__ import annotations

import time

import numpy as np

from ursa.bench.common import Budget, median_ms, report
from ursa.coordinator.selection import finalize_selections
from ursa.edge_sdk.methods.dubhe.draws import (
    assign_ranks,
    participation_probabilities,
    stratified_volunteers,
)
from ursa.edge_sdk.registration import registry_indices, thresholds_for
from ursa.protocol.codebook import Codebook
from ursa.tools.data.metrics import distributions
from ursa.tools.data.partition import dubhe_partition

NUM_CLIENTS = 100_000
K = 100
NUM_CLASSES = 10
SIGMA = (0.7, 0.1)  # the paper's search result for G = {1, 2, 10}
TRIES = 20
SHARED_SEED = 7

BUDGETS = [Budget("rounds_per_s", at_least=10.0)]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(f"bench selection: {message}")


def run(*, as_json: bool, repeats: int = 30) -> int:
    """Measure, print, and return 1 if the selection budget is missed."""
    rng = np.random.default_rng(0)
    population = dubhe_partition(NUM_CLIENTS, NUM_CLASSES, 10.0, 1.5, rng)
    p = distributions(population.counts)
    codebook = Codebook.default(NUM_CLASSES)
    thresholds = thresholds_for(codebook, SIGMA)

    start = time.perf_counter()
    indices = registry_indices(p, codebook, thresholds)
    registry = np.bincount(indices, minlength=codebook.length).astype(np.int64)
    register_ms = (time.perf_counter() - start) * 1000.0

    coins, trims = np.random.default_rng(1), np.random.default_rng(2)

    def paper_round(tries: int = 1) -> np.ndarray:
        prob = participation_probabilities(registry, indices, K)
        volunteers = coins.random((tries, NUM_CLIENTS)) < prob
        return finalize_selections(volunteers, K, trims)

    sets = paper_round()
    _require(sets.shape == (1, K), "a round did not select K devices")
    _require(np.unique(sets).size == K, "a round selected a device twice")
    round_ms = median_ms(paper_round, repeats)
    tries_ms = median_ms(lambda: paper_round(TRIES), max(3, repeats // 5))

    ranks = assign_ranks(indices)
    rounds = iter(range(10**9))

    def stratified_round() -> np.ndarray:
        volunteers = stratified_volunteers(
            registry, indices, ranks, K, SHARED_SEED, next(rounds), 0
        )
        return finalize_selections(volunteers, K, trims)

    first = stratified_volunteers(registry, indices, ranks, K, SHARED_SEED, 0, 0)
    _require(first.sum() == K, "the stratified draw did not give exactly K volunteers")
    stratified_ms = median_ms(stratified_round, repeats)

    figures: dict[str, float | int] = {
        "num_clients": NUM_CLIENTS,
        "k": K,
        "registry_slots": codebook.length,
        "registration_ms": register_ms,
        "round_ms": round_ms,
        "rounds_per_s": 1000.0 / round_ms,
        f"round_{TRIES}_tries_ms": tries_ms,
        "stratified_round_ms": stratified_ms,
        "stratified_rounds_per_s": 1000.0 / stratified_ms,
    }
    return report("ursa bench selection", figures, BUDGETS, as_json=as_json)
