"""In-process, seeded selection simulator: random, greedy and Dubhe side by side.

One run generates a population (`SelectionSimConfig.partition`, Dubhe's by
default), registers every device (Algorithm 1), sums the registries, finds
sigma by the paper's parameter search unless given, then plays ``rounds``
rounds of H tries and reports the mean and spread of ``||p_o - p_u||_1`` per
method.

Two engines play Dubhe's rounds. ``service`` runs them on the production
runtime: the `CoordinatorService` with its `DubheSelection` and one
`EdgeClient` per device with its Dubhe method, over the in-memory bus, real
Paillier at a test-only key size (`ursa.lab.simulate.selection_service`,
one federation per H). ``fast`` (the default, for paper-size runs: the
service engine takes seconds per round at N = 1000) calls the same device
and coordinator functions in vectorised form:
`ursa.edge_sdk.registration` (categories, eq. 6, coins, stratified draw, the
agent's argmin) and `ursa.coordinator.selection` (trim/top-up). The two sums
that the real system computes under encryption go through a `SumBackend`:
the overall registry, and the per-try sums of the members' distributions in
fixed point (`DISTRIBUTION_SCALE`). Plaintext sums of those integers are
exactly what a correct encrypted backend decrypts, and every random choice
comes from a stream derived from the seed, so an encrypted backend reproduces
the same selections.

Random streams (``np.random.default_rng([seed, stream])``): the population,
the search coins and trims, the devices' coins, the coordinator's trims, the
random and greedy baselines, the rank shuffle and the devices' shared seed
each have their own, so adding a method never shifts another method's draws.

Draws and try sums live in `ursa.lab.simulate.selection_draws`, the sigma
search in `ursa.lab.simulate.sigma_search`, the sum backends in
`ursa.lab.simulate.selection_sums` (plaintext) and
`ursa.lab.simulate.encrypted_sums` (Paillier), the participation-rate sweep
and plots in `ursa.lab.simulate.selection_plot`, the population variants in
`ursa.lab.simulate.selection_partition`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ursa.edge_sdk.registration import registry_indices, thresholds_for
from ursa.lab.simulate.baselines import greedy_selection, random_selection
from ursa.lab.simulate.selection_draws import (
    DRAWS,
    STREAM_GREEDY,
    STREAM_POPULATION,
    STREAM_RANDOM,
    agent_pick,
    decoded_try_sums,
    draw_sets,
    rng_stream,
)
from ursa.lab.simulate.selection_partition import PARTITIONS, selection_population
from ursa.lab.simulate.selection_service import service_rounds
from ursa.lab.simulate.selection_sums import (
    DISTRIBUTION_SCALE,
    PLAINTEXT,
    RegistrySum,
    SumBackend,
    TrySums,
    plain_registry_sum,
    plain_try_sums,
)
from ursa.lab.simulate.sigma_search import SEARCH_SCORES, fixed_point, search_sigma
from ursa.protocol.codebook import Codebook, default_groups
from ursa.tools.data.metrics import (
    distance_to_uniform,
    distributions,
    population_distributions,
)
from ursa.tools.data.partition import (
    DEFAULT_SAMPLES_PER_CLIENT,
    DEFAULT_SKEW_SPREAD,
    Population,
)

__all__ = [
    "DISTRIBUTION_SCALE",
    "ENGINES",
    "PAPER_GREEDY",
    "PAPER_REDUCTION",
    "PAPER_TABLE_2",
    "PLAINTEXT",
    "DubheRounds",
    "RegistrySum",
    "SelectionSimConfig",
    "SumBackend",
    "TrySums",
    "evaluate",
    "fast_rounds",
    "make_population",
    "plain_registry_sum",
    "plain_try_sums",
    "search_sigma",
    "simulate_selection",
]

PAPER_TABLE_2 = {"H1": 0.2946, "H2": 0.2588, "H5": 0.2176, "H10": 0.1971, "H20": 0.1750}
PAPER_GREEDY = 0.0144
PAPER_REDUCTION = 0.644
ENGINES = ("fast", "service")


@dataclass(frozen=True)
class SelectionSimConfig:
    """One simulation. ``sigma=None`` runs the parameter search (Dubhe §5.3.2).

    ``draws`` lists the volunteer draws to run: "paper" (reported as "dubhe")
    and/or "stratified" (reported as "dubhe_stratified"). ``search_score`` is
    the agent's criterion in the search: "paper" or "distance" (see
    `search_sigma`). ``skew_spread`` spreads the device skews (0: all equal).
    ``partition`` names the population generator (`PARTITIONS`; "dubhe" is
    `ursa.tools.data.partition.dubhe_partition`). ``engine`` plays Dubhe's
    rounds: "fast" (this module's vectorised draws) or "service" (the
    production coordinator and devices, `ursa.lab.simulate.selection_service`,
    one federation per H).
    """

    num_classes: int = 10
    num_clients: int = 1000
    k: int = 20
    rho: float = 10.0
    emd: float = 1.5
    tries: tuple[int, ...] = (1, 5, 20)
    rounds: int = 500
    seed: int = 0
    groups: tuple[int, ...] | None = None
    sigma: tuple[float, ...] | None = None
    draws: tuple[str, ...] = ("paper",)
    samples_per_client: int = DEFAULT_SAMPLES_PER_CLIENT
    skew_spread: float = DEFAULT_SKEW_SPREAD
    search_tries: int = 100
    search_steps: int = 10
    search_score: str = "paper"
    partition: str = "dubhe"
    engine: str = "fast"

    def __post_init__(self) -> None:
        if not self.tries or min(self.tries) < 1:
            raise ValueError(f"tries must be positive, got {self.tries}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if not self.draws or set(self.draws) - set(DRAWS):
            raise ValueError(f"draws must be among {DRAWS}, got {self.draws}")
        if self.search_score not in SEARCH_SCORES:
            raise ValueError(f"search_score must be one of {SEARCH_SCORES}")
        if self.partition not in PARTITIONS:
            raise ValueError(f"partition must be one of {PARTITIONS}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if not 1 <= self.k <= self.num_clients:
            raise ValueError(f"need 1 <= K <= N, got K={self.k}, N={self.num_clients}")

    def codebook(self) -> Codebook:
        """The registry codebook for these classes and groups."""
        return Codebook(
            self.num_classes, self.groups or default_groups(self.num_classes)
        )


def _stats(values: NDArray[np.float64]) -> dict[str, float]:
    return {"mean": float(values.mean()), "std": float(values.std())}


@dataclass(frozen=True)
class DubheRounds:
    """One draw's rounds as an engine played them.

    Attributes:
        picks: Per H, the adopted set of every round (rounds x K indices).
        registry: The overall registry (devices per slot).
        volunteers: Per round, the devices that drew yes in try 0.
        runs: Per H, what a service run reports of itself (empty: fast).
    """

    picks: dict[int, NDArray[np.int64]]
    registry: NDArray[np.int64]
    volunteers: NDArray[np.int64]
    runs: dict[str, dict[str, float]]


def fast_rounds(
    p: NDArray[np.float64],
    config: SelectionSimConfig,
    draw: str,
    point: tuple[float, ...],
    backend: SumBackend = PLAINTEXT,
) -> DubheRounds:
    """The fast engine: every H reads the first H of the same max(H) tries."""
    codebook = config.codebook()
    indices = registry_indices(p, codebook, thresholds_for(codebook, point))
    registry = backend.registry_sum(indices, codebook.length)
    sets, volunteers = draw_sets(
        draw,
        registry,
        indices,
        config.k,
        config.rounds,
        max(config.tries),
        config.seed,
        search=False,
    )
    sums = decoded_try_sums(sets, fixed_point(p), backend)
    picks = {h: agent_pick(sets, sums, h) for h in config.tries}
    return DubheRounds(picks, registry, volunteers[:, 0], {})


def service_engine_rounds(
    counts: NDArray[np.int64],
    config: SelectionSimConfig,
    draw: str,
    point: tuple[float, ...],
) -> DubheRounds:
    """The service engine: one production federation per H (`service_rounds`)."""
    codebook = config.codebook()
    p = distributions(counts)
    indices = registry_indices(p, codebook, thresholds_for(codebook, point))
    picks: dict[int, NDArray[np.int64]] = {}
    runs: dict[str, dict[str, float]] = {}
    volunteers = np.zeros(config.rounds, dtype=np.int64)
    for h in config.tries:
        run = service_rounds(
            counts,
            codebook,
            point,
            k=config.k,
            tries=h,
            rounds=config.rounds,
            seed=config.seed,
            draw=draw,
        )
        picks[h] = run.selections
        runs[f"H{h}"] = {"elapsed_s": run.elapsed_s, "key_epochs": run.key_epochs}
        if h == max(config.tries):
            volunteers = run.volunteers
    registry = plain_registry_sum(indices, codebook.length)  # what devices decrypt
    return DubheRounds(picks, registry, volunteers, runs)


def evaluate(
    p: NDArray[np.float64],
    config: SelectionSimConfig,
    *,
    greedy_rounds: int | None = None,
    backend: SumBackend = PLAINTEXT,
    keep_selections: bool = False,
    counts: NDArray[np.int64] | None = None,
) -> dict[str, Any]:
    """Run every method on one population (N x C distributions ``p``).

    Uses ``config``'s K, tries, rounds, seed, sigma, draws, search settings and
    engine (not its population settings). Returns per-method stats, the
    adopted sigma, and each method's mean class proportions; with
    ``keep_selections`` also every round's adopted set per Dubhe variant and
    H ("selections"). The service engine needs the label ``counts`` (the
    devices' data) and computes its sums itself (``backend`` is the fast
    engine's).

    Raises:
        ValueError: the service engine without ``counts``, or with a backend.
    """
    service = config.engine == "service"
    if service and (counts is None or backend is not PLAINTEXT):
        raise ValueError("the service engine needs the label counts and no backend")
    codebook = config.codebook()
    k, rounds, seed = config.k, config.rounds, config.seed
    out: dict[str, Any] = {}
    props: dict[str, list[float]] = {"global": p.mean(axis=0).tolist()}
    kept: dict[str, list[list[int]]] = {}

    def record(name: str, chosen: NDArray[np.int64]) -> dict[str, float]:
        p_o = population_distributions(p, chosen)
        props[name] = p_o.mean(axis=0).tolist()
        if keep_selections and name.startswith("dubhe"):
            kept[name] = chosen.tolist()
        return _stats(distance_to_uniform(p_o))

    randoms = random_selection(p.shape[0], k, rounds, rng_stream(seed, STREAM_RANDOM))
    out["random"] = record("random", randoms)
    g_rounds = rounds if greedy_rounds is None else max(1, min(rounds, greedy_rounds))
    out["greedy"] = record(
        "greedy", greedy_selection(p, k, g_rounds, rng_stream(seed, STREAM_GREEDY))
    )
    for draw in config.draws:
        key = "dubhe" if draw == "paper" else f"dubhe_{draw}"
        suffix = key.removeprefix("dubhe")
        if config.sigma is None:
            backend.phase(f"search:{draw}")
            point, _ = search_sigma(
                p,
                codebook,
                k,
                draw=draw,
                tries=config.search_tries,
                steps=config.search_steps,
                score=config.search_score,
                seed=seed,
                backend=backend,
            )
        else:
            point = tuple(config.sigma)
        backend.phase(f"rounds:{draw}")
        played = (
            service_engine_rounds(counts, config, draw, point)
            if counts is not None and service
            else fast_rounds(p, config, draw, point, backend)
        )
        per_h = {f"H{h}": record(f"{key}_H{h}", played.picks[h]) for h in config.tries}
        out[key] = per_h
        out[f"reduction_vs_random{suffix}"] = {
            name: 1.0 - v["mean"] / out["random"]["mean"] for name, v in per_h.items()
        }
        out[f"sigma{suffix}"] = [*point, 0.0]
        out[f"registry_nonzero{suffix}"] = int(np.count_nonzero(played.registry))
        out[f"volunteers{suffix}"] = _stats(played.volunteers.astype(np.float64))
        if played.runs:
            out[f"service{suffix}"] = played.runs
    out["class_proportions"] = props
    if keep_selections:
        out["selections"] = kept
    return out


def make_population(config: SelectionSimConfig) -> Population:
    """The config's population (``config.partition``, seeded by ``config.seed``)."""
    return selection_population(
        config.partition,
        config.num_clients,
        config.num_classes,
        config.rho,
        config.emd,
        rng_stream(config.seed, STREAM_POPULATION),
        samples_per_client=config.samples_per_client,
        skew_spread=config.skew_spread,
    )


def simulate_selection(
    config: SelectionSimConfig,
    backend: SumBackend = PLAINTEXT,
    *,
    keep_selections: bool = False,
) -> dict[str, Any]:
    """Generate the population, run every method, and return the report dict."""
    start = time.perf_counter()
    population = make_population(config)
    codebook = config.codebook()
    p = distributions(population.counts)
    result = evaluate(
        p,
        config,
        backend=backend,
        keep_selections=keep_selections,
        counts=population.counts,
    )
    report: dict[str, Any] = {
        "config": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in asdict(config).items()
        },
        "population": {
            "rho": population.rho,
            "emd_avg": population.emd_avg,
            "requested_rho": config.rho,
            "requested_emd": config.emd,
            "partition": config.partition,
            "mean_top_class": float(p.max(axis=1).mean()),
            "num_clients": config.num_clients,
            "num_classes": config.num_classes,
        },
        "groups": list(codebook.groups),
        "registry_length": codebook.length,
    }
    report.update(result)
    report["paper"] = {
        "dubhe": PAPER_TABLE_2,
        "greedy": PAPER_GREEDY,
        "reduction_vs_random": PAPER_REDUCTION,
    }
    report["elapsed_s"] = time.perf_counter() - start
    return report
