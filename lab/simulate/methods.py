"""One seeded in-process FL run: selection, CLIMB duals, training, aggregation, eval.

`run_method` plays ``rounds`` rounds of one method on one `Federation` with the
system's own algorithm code, only without a broker:

* selection: ``random`` or ``dubhe`` (`ursa.lab.simulate.participants`,
  with the devices' and coordinator's own Dubhe functions);
* ``climb``: every ``dual_period`` rounds all N devices evaluate ``f_i`` at the
  global model and run `ursa.edge_sdk.methods.climb.dual.apply_dual_means_all` on the
  means (plaintext means, or with ``climb_encrypted`` the real Paillier path:
  `encrypt_dual_report` -> `ursa.coordinator.methods.climb.dual_sum` ->
  `decrypt_dual_means`);
  participants scale their deltas by ``w_i``; with ``engine="production"``
  the dual steps are the production objects' instead: the coordinator's
  `ClimbDualStep` and every device's `Climb` over the in-memory bus
  (`ursa.lab.simulate.climb_fleet`, real Paillier at ``key_bits``), of which
  the reference loop above is the fast twin (tested equal);
* ``feddisk``: phase 1 (`ursa.lab.simulate.feddisk`), then weighted rounds;
  with ``engine="production"`` the whole run is the production runtime's
  instead: the coordinator's `FeddiskPlugin` and one `EdgeClient` per device
  over the in-memory bus, secure aggregation on
  (`ursa.lab.simulate.feddisk_service`; random selection only);
* ``focal``: local focal loss (gamma 2, as the CLIMB reference code);
* training: `ursa.lab.simulate.fleet_mlp.train_fleet` (the vectorised equivalent of
  `train_local`, tested equal) or ``trainer="sequential"`` (`train_local` per
  device); aggregation: `ursa.coordinator.aggregation` (FedAvg by sample count,
  equal weights under FedVC, CLIMB's average of scaled deltas).

Every random stream derives from the seed: the same seed gives every method the
same federation, initial model and device seeds (a paired comparison).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ursa.coordinator.aggregation import (
    DeviceDelta,
    Weighting,
    apply_update,
    finalize_aggregation,
    init_aggregation,
)
from ursa.coordinator.encrypted_sum import add_report, finalize_encrypted_sum
from ursa.coordinator.methods.climb.dual_sum import init_dual_sum
from ursa.crypto.paillier import PaillierPublicKey, PaillierSecretKey, generate_keypair
from ursa.edge_sdk.methods.climb.dual import (
    ClimbConfig,
    DualMeans,
    apply_dual_means_all,
    decrypt_dual_means,
    encrypt_dual_report,
    plain_dual_means,
)
from ursa.edge_sdk.training import TrainConfig, train_local
from ursa.lab.simulate.climb_fleet import ClimbFleet, device_id
from ursa.lab.simulate.feddisk import (
    MadePhaseSettings,
    feddisk_phase_one,
    initial_made,
)
from ursa.lab.simulate.fleet_mlp import (
    FleetResult,
    cross_entropy,
    forward,
    train_fleet,
)
from ursa.lab.simulate.participants import make_selector
from ursa.models.registry import initial_arrays
from ursa.models.weights import Arrays
from ursa.tools.data.federation import DeviceData, Federation
from ursa.tools.data.metrics import distributions

METHODS = ("fedavg", "focal", "climb", "feddisk")
TRAINERS = ("vectorised", "sequential")
ENGINES = ("reference", "production")
"""How CLIMB's dual steps and FedDisk's run: the simulator's loop, or production."""
FINAL_WINDOW = 10
"""Final accuracy = mean of the last this-many rounds (the issue's definition)."""

_INIT, _SELECT, _DEVICE, _FEDDISK = range(4)


@dataclass(frozen=True)
class RunSettings:
    """Everything a run needs besides the federation, the method and the seed."""

    rounds: int = 200
    participants: int = 100
    train: TrainConfig = field(default_factory=TrainConfig)
    hidden_sizes: tuple[int, ...] = (128, 128)
    climb: ClimbConfig = field(default_factory=ClimbConfig)
    dual_period: int = 1
    climb_encrypted: bool = False
    key_bits: int = 2048
    selection: str = "random"
    dubhe_tries: int = 20
    feddisk: MadePhaseSettings = field(default_factory=MadePhaseSettings)
    trainer: str = "vectorised"
    engine: str = "reference"


@dataclass(frozen=True)
class RunResult:
    """One (method, seed) run: the curves and what the report needs."""

    method: str
    seed: int
    accuracy: list[float]
    per_class_final: list[float]
    extra_rounds: int
    diagnostics: dict[str, Any]
    elapsed_s: float
    climb_weights: tuple[float, ...] = ()
    """CLIMB: every device's ``w_i`` after the run (device order)."""


def run_method(
    fed: Federation, method: str, settings: RunSettings, seed: int
) -> RunResult:
    """Play ``settings.rounds`` rounds of ``method`` on ``fed``.

    Raises:
        ValueError: an unknown method, selection or trainer, or K > N.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
    if settings.trainer not in TRAINERS:
        raise ValueError(
            f"unknown trainer {settings.trainer!r}; choose from {TRAINERS}"
        )
    if settings.engine not in ENGINES:
        raise ValueError(f"unknown engine {settings.engine!r}; choose from {ENGINES}")
    n, k = fed.num_devices, settings.participants
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= K <= N, got K={k}, N={n}")
    start = time.perf_counter()
    model_config = {
        "input_dim": fed.input_dim,
        "num_classes": fed.num_classes,
        "hidden_sizes": list(settings.hidden_sizes),
    }
    arrays = initial_arrays("mlp", model_config, seed=_seed(seed, _INIT))
    p = distributions(fed.counts)
    if method == "feddisk" and settings.engine == "production":
        return _feddisk_production(fed, settings, seed, arrays, model_config, start)
    select, select_info = make_selector(
        settings.selection, p, k, np.random.default_rng([seed, _SELECT]),
        tries=settings.dubhe_tries,
    )  # fmt: skip
    config = settings.train
    if method == "focal":
        config = config.model_copy(update={"loss": "focal"})
    devices = list(fed.devices)
    diagnostics: dict[str, Any] = {"selection": select_info}
    extra_rounds = 0
    if method == "feddisk":
        phase = feddisk_phase_one(
            fed, settings.feddisk, select, np.random.default_rng([seed, _FEDDISK])
        )
        devices = [
            DeviceData(d.x, d.y, w) for d, w in zip(devices, phase.weights, strict=True)
        ]
        extra_rounds = phase.made_rounds
        diagnostics["feddisk"] = phase.summary
    weighting = Weighting.EQUAL if config.fedvc_samples else Weighting.FEDAVG
    climb = _ClimbState(fed, settings, seed) if method == "climb" else None
    if climb is not None:
        weighting = Weighting.CLIMB
    accuracy: list[float] = []
    per_class: list[npt.NDArray[np.float64]] = []
    distances: list[float] = []
    try:
        for rnd in range(settings.rounds):
            chosen = select(extra_rounds + rnd)
            distances.append(
                float(np.abs(p[chosen].mean(axis=0) - 1 / fed.num_classes).sum())
            )
            scales = None
            if climb is not None:
                climb.before_round(rnd, arrays, devices, chosen)
                scales = climb.weights[chosen].tolist()
            seeds = [_device_seed(seed, rnd, int(i)) for i in chosen]
            results = _train(
                settings,
                model_config,
                arrays,
                [devices[i] for i in chosen],
                config,
                seeds,
                scales,
            )
            state = init_aggregation(arrays, weighting)
            for i, res in zip(chosen, results, strict=True):
                update = DeviceDelta(device_id(int(i)), res.delta, res.num_examples)
                state, _ = apply_update(state, update)
            arrays = finalize_aggregation(state, arrays)
            acc, classes = evaluate_arrays(
                arrays, fed.test_x, fed.test_y, fed.num_classes
            )
            accuracy.append(acc)
            per_class.append(classes)
    finally:
        if climb is not None:
            climb.close()
    diagnostics["selection"]["mean_distance_to_uniform"] = float(np.mean(distances))
    if climb is not None:
        diagnostics["climb"] = climb.summary()
    return RunResult(
        method,
        seed,
        accuracy,
        _final_per_class(per_class),
        extra_rounds,
        diagnostics,
        time.perf_counter() - start,
        () if climb is None else tuple(float(w) for w in climb.weights),
    )


def _feddisk_production(
    fed: Federation,
    settings: RunSettings,
    seed: int,
    arrays: Arrays,
    model_config: dict[str, Any],
    start: float,
) -> RunResult:
    """FedDisk on the production coordinator and devices (`feddisk_service`).

    Raises:
        ValueError: a selection other than random, or FedVC.
    """
    from ursa.lab.simulate.feddisk_service import feddisk_service_run

    if settings.selection != "random":
        raise ValueError(
            f"FedDisk's production engine selects at random, not {settings.selection!r}"
        )
    accuracy: list[float] = []
    per_class: list[npt.NDArray[np.float64]] = []

    def score(model: Arrays) -> None:
        acc, classes = evaluate_arrays(model, fed.test_x, fed.test_y, fed.num_classes)
        accuracy.append(acc)
        per_class.append(classes)

    run = feddisk_service_run(
        fed,
        initial=arrays,
        made_initial=initial_made(
            fed.input_dim, settings.feddisk, np.random.default_rng([seed, _FEDDISK])
        ),
        hidden_sizes=settings.hidden_sizes,
        train=settings.train,
        made=settings.feddisk,
        rounds=settings.rounds,
        participants=settings.participants,
        seed=seed,
        key_bits=settings.key_bits,
        on_model=score,
    )
    p = distributions(fed.counts)
    distances = [
        float(np.abs(p[list(chosen)].mean(axis=0) - 1 / fed.num_classes).sum())
        for chosen in run.selections
    ]
    selection = {
        "kind": "random",
        "engine": "production",
        "mean_distance_to_uniform": float(np.mean(distances)),
    }
    return RunResult(
        "feddisk",
        seed,
        accuracy,
        _final_per_class(per_class),
        run.made_rounds,
        {"selection": selection, "feddisk": run.summary()},
        time.perf_counter() - start,
    )


def _final_per_class(per_class: Sequence[npt.NDArray[np.float64]]) -> list[float]:
    """Per-class accuracy over the last `FINAL_WINDOW` rounds."""
    with warnings.catch_warnings():  # a class absent from the test set stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        final = np.nanmean(np.stack(per_class[-FINAL_WINDOW:]), axis=0)
    return [float(v) for v in final]


def evaluate_arrays(
    arrays: Arrays,
    x: npt.NDArray[np.float32],
    y: npt.NDArray[np.int64],
    num_classes: int,
) -> tuple[float, npt.NDArray[np.float64]]:
    """Test accuracy and per-class accuracy (NaN for an absent class)."""
    pred = forward(arrays, x).argmax(axis=1)
    hits = np.bincount(y, weights=(pred == y).astype(np.float64), minlength=num_classes)
    counts = np.bincount(y, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = hits / counts
    return float((pred == y).mean()), per_class


def device_losses(
    arrays: Arrays, devices: Sequence[DeviceData]
) -> npt.NDArray[np.float64]:
    """``f_i``: each device's mean cross-entropy at ``arrays`` (= `evaluate_loss`)."""
    x = np.concatenate([d.x for d in devices])
    y = np.concatenate([d.y for d in devices])
    owner = np.repeat(np.arange(len(devices)), [len(d.y) for d in devices])
    ce = cross_entropy(forward(arrays, x), y)
    sums = np.bincount(owner, weights=ce, minlength=len(devices))
    out: npt.NDArray[np.float64] = sums / np.bincount(owner, minlength=len(devices))
    return out


class _ClimbState:
    """The devices' dual variables: kept by the simulator, or by the devices.

    The reference engine keeps them on the devices' behalf; the production
    engine reads them from the devices of a `ClimbFleet`.
    """

    def __init__(self, fed: Federation, settings: RunSettings, seed: int) -> None:
        self.config = settings.climb
        self.period = settings.dual_period
        self.engine = settings.engine
        self.encrypted = settings.climb_encrypted or self.engine == "production"
        self.lambdas = np.zeros(fed.num_devices)
        self.weights = np.ones(fed.num_devices)
        self.steps = 0
        self.max_lambda = 0.0
        self.keys: tuple[PaillierPublicKey, PaillierSecretKey] | None = None
        self.fleet: ClimbFleet | None = None
        if self.engine == "production":
            self.fleet = ClimbFleet(
                fed.devices,
                self.config,
                dual_period=self.period,
                key_bits=settings.key_bits,
                num_classes=fed.num_classes,
            )
        elif self.encrypted:
            self.keys = generate_keypair(settings.key_bits)

    def before_round(
        self,
        rnd: int,
        arrays: Arrays,
        devices: Sequence[DeviceData],
        chosen: npt.NDArray[np.int64],
    ) -> None:
        """Round ``rnd`` (from 0): the dual step if one is due."""
        if self.fleet is not None:  # the step's own period, rounds from 1
            selected = [device_id(int(i)) for i in chosen]
            if self.fleet.dual_step(rnd + 1, arrays, selected):
                self._stepped(self.fleet.weights, self.fleet.lambdas)
        elif rnd % self.period == 0:
            self.dual_step(arrays, devices)

    def dual_step(self, arrays: Arrays, devices: Sequence[DeviceData]) -> None:
        losses = device_losses(arrays, devices)
        means = self._means(losses)
        self._stepped(*apply_dual_means_all(losses, self.lambdas, means, self.config))

    def _stepped(
        self, weights: npt.NDArray[np.float64], lambdas: npt.NDArray[np.float64]
    ) -> None:
        self.weights, self.lambdas = weights, lambdas
        self.steps += 1
        self.max_lambda = max(self.max_lambda, float(self.lambdas.max()))

    def close(self) -> None:
        """Remove the production engine's stores."""
        if self.fleet is not None:
            self.fleet.close()

    def _means(self, losses: npt.NDArray[np.float64]) -> DualMeans:
        if self.keys is None:
            return plain_dual_means(losses, self.lambdas, self.config)
        public, secret = self.keys
        state = init_dual_sum(public, max_parties=self.config.max_parties)
        for i, (f, lam) in enumerate(zip(losses, self.lambdas, strict=True)):
            report = encrypt_dual_report(public, self.config, float(f), float(lam))
            state, _ = add_report(state, device_id(i), report.to_bytes(public))
        return decrypt_dual_means(secret, self.config, finalize_encrypted_sum(state))

    def summary(self) -> dict[str, Any]:
        lam = self.lambdas
        return {
            "engine": self.engine,
            "dual_steps": self.steps,
            "encrypted": self.encrypted,
            "final_lambda": {"mean": float(lam.mean()), "max": float(lam.max())},
            "max_lambda_seen": self.max_lambda,
            "final_weight": {
                "min": float(self.weights.min()),
                "max": float(self.weights.max()),
            },
        }


def _train(
    settings: RunSettings,
    model_config: dict[str, Any],
    arrays: Arrays,
    devices: list[DeviceData],
    config: TrainConfig,
    seeds: list[int],
    scales: list[float] | None,
) -> list[FleetResult]:
    if settings.trainer == "vectorised":
        return train_fleet(
            arrays, devices, config=config, seeds=seeds, delta_scales=scales
        )
    out = []
    for j, dev in enumerate(devices):
        res = train_local(
            "mlp", model_config, arrays, dev.x, dev.y,
            config=config.model_copy(update={"seed": seeds[j]}),
            sample_weights=dev.sample_weights,
            delta_scale=1.0 if scales is None else scales[j],
        )  # fmt: skip
        out.append(
            FleetResult(res.delta, res.num_examples, res.mean_train_loss, res.num_steps)
        )
    return out


def _seed(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def _device_seed(seed: int, rnd: int, device: int) -> int:
    return int(
        np.random.SeedSequence([seed, _DEVICE, rnd, device]).generate_state(1)[0]
    )
