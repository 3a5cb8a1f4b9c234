"""Decrypted means: one device forges its secure-mean reports (docs: "Decrypted means").

The real coordinator and `EdgeClient` devices over the in-memory bus; the
attacker's transport swaps the ciphertext of each of its `MeanReport` s for a
hand-packed vector (`means_fleet.forged_vector`) that no honest codec would
encode. Each test asserts what the honest fleet ends with:

* the issue's row: one CLIMB report with a huge lambda slot (before: every
  honest weight -998 and a diverging model) is refused by every honest
  device, which keeps its weight; the model is the one of those weights;
* within the honest range the forged slot is accepted, and the honest
  weights stay in ``[0, 1 + lambda_max]`` (hypothesis over the slot);
* a forged MADE loss cannot stop or stretch FedDisk's phase 1 beyond what
  its stopper and the coordinator's round cap allow;
* forged evaluation counts (a claimed crowd of evaluating devices) are
  refused, so the agent discloses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adversarial.means_fleet import (
    ATTACKER,
    PLAIN,
    EvaluatingTrainer,
    FixedMadeTrainer,
    Fleet,
    Forge,
    RecordingTrainer,
    forged_vector,
    honest_ids,
    max_abs,
    real_slot,
    refusals,
    run_out,
    start_fleet,
    training_plugin,
    weighted_oracle,
)
from tests.coordinator.conftest import Federation
from tests.coordinator.test_training import INITIAL
from ursa.coordinator.config import EvaluationConfig, RegistryConfig
from ursa.coordinator.fleet_eval import FleetEvaluation
from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin
from ursa.coordinator.methods_config import ClimbSpec, FedAvgSpec, FeddiskSpec
from ursa.coordinator.plugin import CoordinatorView, NoSteps, PluginContext
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.crypto.paillier import PaillierPublicKey, encrypted_vector_from
from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.methods.feddisk.made_loss import MadeLossCodec
from ursa.edge_sdk.methods.feddisk.method import FedDisk
from ursa.edge_sdk.methods_config import ClimbDeviceSpec as DeviceClimbSpec
from ursa.models.weights import arrays_to_bytes
from ursa.protocol.messages import (
    CLIMB_DUAL,
    FLEET_EVAL,
    MADE_LOSS,
    MAX_EVAL_COUNT,
    MeanReport,
)
from ursa.protocol.messages.evaluation import FLEET_EVAL_CODEC

CLIMB = ClimbConfig(eta_d=0.5, epsilon=0.01)
CODEC = CLIMB.codec()
DEVICES, K_SELECTED, ROUNDS = 6, 3, 3
KEY_BITS = 1024
"""Test-only key size: the logic, not the security."""


def lambda_forge(value: float, *, loss: float = 0.5) -> Forge:
    """The attacker reports ``[loss, value]``: lambda far beyond ``lambda_max``."""
    return slot_forge(real_slot(CODEC, loss), real_slot(CODEC, value))


def slot_forge(loss_slot: int, lambda_slot: int) -> Forge:
    """The attacker's dual report as two raw slots."""

    def forge(report: MeanReport, key: PaillierPublicKey) -> bytes:
        assert report.purpose == CLIMB_DUAL
        return forged_vector(key, CODEC, CLIMB.max_parties, [loss_slot, lambda_slot])

    return forge


MakeFleet = Callable[..., Fleet]


@pytest.fixture
def climb_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeFleet]:
    """Start CLIMB fleets (one per call), each in its own directory; close them."""
    made: list[Federation] = []

    def make(forge: Forge | None, rounds: int = ROUNDS) -> Fleet:
        tmp = tmp_path_factory.mktemp("climb")
        fed = Federation(
            tmp,
            num_devices=DEVICES,
            k=K_SELECTED,
            tries=1,
            rounds=rounds,
            key_bits=KEY_BITS,
        )
        made.append(fed)
        return start_fleet(
            fed,
            plugin=training_plugin(fed, tmp),
            steps=[ClimbDualStep.later()],
            training=ClimbSpec(),
            forge=forge,
            trainer=RecordingTrainer,
            device_training=DeviceClimbSpec.model_validate(CLIMB.model_dump()),
        )

    yield make
    for fed in made:
        fed.close()
        assert fed.bus.handler_errors == 0


def honest_scales(fleet: Fleet) -> list[tuple[str, int, float]]:
    """(device, round, weight) of every honest training."""
    out = []
    for device in honest_ids(fleet.fed):
        trainer = fleet.trainers[device]
        assert isinstance(trainer, RecordingTrainer)
        out += [(device, r, scale) for r, scale in trainer.scales]
    return out


def test_the_tables_huge_lambda_slot_is_refused_and_honest_weights_are_kept(
    climb_fleet: MakeFleet,
) -> None:
    """The row: a lambda slot of K * 999 (before: every honest w = -998)."""
    honest = climb_fleet(None)
    attacked = climb_fleet(lambda_forge(DEVICES * 999.0))
    fed = attacked.fed

    assert fed.coordinator.is_done and attacked.plugin.version == ROUNDS
    assert attacked.forger is not None and attacked.forger.forged == ROUNDS
    assert refusals(fed, CLIMB_DUAL) == {
        r: set(fed.device_ids) for r in range(1, ROUNDS + 1)
    }
    scales = honest_scales(attacked)
    assert scales and all(scale == 1.0 for _, _, scale in scales)
    for device in honest_ids(fed):
        climb = fed.devices[device].method(Climb)
        assert (climb.weight, climb.lam) == (1.0, 0.0)  # the previous state
    expected = weighted_oracle(attacked, lambda r, d: 1.0, ROUNDS)
    for name, value in attacked.plugin.global_arrays.items():
        assert np.all(np.isfinite(value))
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6)
    # the runs differ only by the honest run's CLIMB weights (w - 1 scales it)
    departure = max(abs(s - 1.0) for _, _, s in honest_scales(honest))
    assert departure > 0.05, "the honest run should move its weights"
    gap = max(
        float(np.max(np.abs(value - honest.plugin.global_arrays[name])))
        for name, value in attacked.plugin.global_arrays.items()
    )
    assert gap < departure * max_abs(honest.plugin.global_arrays)


def test_inside_the_honest_range_one_party_can_zero_the_weights_no_more(
    climb_fleet: MakeFleet,
) -> None:
    """The worst in-range forgery: the lambda sum at K * lambda_max (docs' figure)."""
    attacked = climb_fleet(lambda_forge(DEVICES * CLIMB.lambda_max), rounds=1)
    fed = attacked.fed

    assert fed.coordinator.is_done and refusals(fed, CLIMB_DUAL) == {}
    # mean lambda = lambda_max, every honest lambda 0: w = clip(1 - 100) = 0
    scales = honest_scales(attacked)
    assert scales and all(scale == 0.0 for _, _, scale in scales)
    np.testing.assert_allclose(
        attacked.plugin.global_arrays["w"],
        weighted_oracle(attacked, lambda r, d: 0.0, 1)["w"],
    )


SLOT_BITS = CODEC.layout(CLIMB.max_parties, KEY_BITS).slot_bits
RANGE_EDGE = DEVICES * CLIMB.lambda_max


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    slot=st.one_of(
        st.integers(0, (1 << SLOT_BITS) - 1),
        st.floats(-50.0, RANGE_EDGE + 50.0).map(lambda v: real_slot(CODEC, v)),
        st.sampled_from([real_slot(CODEC, 0.0), real_slot(CODEC, RANGE_EDGE)]),
    )
)
def test_any_forged_lambda_slot_leaves_honest_weights_in_range(
    climb_fleet: MakeFleet, slot: int
) -> None:
    attacked = climb_fleet(slot_forge(real_slot(CODEC, 0.5), slot), rounds=1)
    fed = attacked.fed
    value = (slot - CODEC.offset) / 2**CODEC.scale_bits  # what it claims
    slack = DEVICES * 2.0 ** -(CODEC.scale_bits + 1)

    assert fed.coordinator.is_done
    refused = refusals(fed, CLIMB_DUAL).get(1, set())
    total = value  # round 1: every honest lambda is 0
    in_range = -slack <= total <= RANGE_EDGE + slack
    assert refused == (set() if in_range else set(fed.device_ids))
    expected = float(np.clip(1.0 - total / DEVICES, 0.0, CLIMB.max_weight))
    for device in honest_ids(fed):
        weight = fed.devices[device].method(Climb).weight
        assert weight == (pytest.approx(expected, abs=1e-6) if in_range else 1.0)
    for _, _, scale in honest_scales(attacked):
        assert 0.0 <= scale <= CLIMB.max_weight
    assert all(np.all(np.isfinite(v)) for v in attacked.plugin.global_arrays.values())


# --- evaluation counts -----------------------------------------------------------

CLASSES = EvaluatingTrainer.NUM_CLASSES
EVAL_CODEC = FLEET_EVAL_CODEC


def eval_forge(values: list[float]) -> Forge:
    """The attacker's ``[correct.., total.., evaluated]``, unclamped."""

    def forge(report: MeanReport, key: PaillierPublicKey) -> bytes:
        assert report.purpose == FLEET_EVAL
        slots = [real_slot(EVAL_CODEC, v) for v in values]
        return forged_vector(key, EVAL_CODEC, EVAL_PARTIES, slots)

    return forge


EVAL_PARTIES = RegistryConfig().max_parties
"""The key epoch's ``max_parties``: the evaluation codec's party bound."""
EVAL_ROUNDS = 3


def eval_fleet(tmp: Path, forge: Forge | None) -> Fleet:
    tmp.mkdir()
    # Explicit replies (the default at this size): the devices train and
    # answer before the agent's result of the round's evaluation is delivered
    # on the synchronous bus, so the round must wait for it (`awaits`).
    fed = Federation(
        tmp, num_devices=DEVICES, k=K_SELECTED, tries=1, rounds=EVAL_ROUNDS,
        key_bits=KEY_BITS,
    )  # fmt: skip
    step = FleetEvaluation.later(
        EvaluationConfig(every=1, timeout_s=30),
        num_classes=CLASSES,
        max_parties=fed.config.registry.max_parties,
    )
    return start_fleet(
        fed,
        plugin=training_plugin(fed, tmp),
        steps=[step],
        training=FedAvgSpec(),
        forge=forge,
        trainer=EvaluatingTrainer,
    )


def federated_evals(fleet: Fleet) -> dict[int, Any]:
    return {
        r.round: r.metrics["federated_eval"]
        for r in fleet.plugin.history
        if "federated_eval" in r.metrics
    }


@pytest.mark.parametrize(
    ("label", "values"),
    [
        ("a crowd of evaluating devices", [0.0] * (2 * CLASSES) + [1000.0]),
        ("more correct than seen", [500.0] + [0.0] * (2 * CLASSES)),
        ("negative samples", [0.0] * CLASSES + [-12.0] * CLASSES + [0.0]),
    ],
)
def test_forged_evaluation_counts_are_refused_and_never_disclosed(
    tmp_path: Path, label: str, values: list[float]
) -> None:
    honest = eval_fleet(tmp_path / "honest", None)
    attacked = eval_fleet(tmp_path / "attacked", eval_forge(values))
    try:
        due = list(range(2, EVAL_ROUNDS + 1))  # evaluation before rounds 2, 3
        assert sorted(federated_evals(honest)) == due
        # six devices, each wrong on one class of ten: 2 * 9 / 20 right
        assert federated_evals(honest)[2]["accuracy"] == pytest.approx(0.9)
        fed = attacked.fed
        assert fed.coordinator.is_done and attacked.plugin.version == EVAL_ROUNDS
        assert refusals(fed, FLEET_EVAL) == {r: set(fed.device_ids) for r in due}
        assert federated_evals(attacked) == {}  # the agent disclosed nothing
        assert fed.messages("mean_result") == []
        for device in honest_ids(fed):
            assert fed.devices[device].evaluation.last is None
    finally:
        for fleet in (honest, attacked):
            fleet.fed.close()
            assert fleet.fed.bus.handler_errors == 0


# --- FedDisk's MADE loss ----------------------------------------------------------

MADE_CODEC = MadeLossCodec()
MADE_ROUNDS, CLASSIFIER_ROUNDS = 3, 1
FEDDISK = FeddiskSpec(
    max_made_rounds=MADE_ROUNDS, loss_timeout_s=5, verdict_timeout_s=2
)
"""A missing verdict costs ``verdict_timeout_s``, inside the round's deadline."""


def made_forge(loss_total: float, examples: float) -> Forge:
    """The attacker's ``[nll * n, n]``, unclamped."""

    def forge(report: MeanReport, key: PaillierPublicKey) -> bytes:
        assert report.purpose == MADE_LOSS
        fixed = MADE_CODEC.codec()
        slots = [real_slot(fixed, loss_total), real_slot(fixed, examples)]
        return forged_vector(key, fixed, MADE_CODEC.max_parties, slots)

    return forge


def feddisk_fleet(tmp: Path, forge: Forge | None) -> Fleet:
    tmp.mkdir()
    fed = Federation(
        tmp, num_devices=DEVICES, k=K_SELECTED, tries=1,
        rounds=MADE_ROUNDS + CLASSIFIER_ROUNDS, key_bits=KEY_BITS,
    )  # fmt: skip
    made_file = tmp / "made.ursw"
    made_file.write_bytes(arrays_to_bytes(INITIAL))
    state = fed.config.state_dir

    def training(view: CoordinatorView, model: str) -> TrainingPlugin:
        return TrainingPlugin(
            PluginContext(view, NoSteps()),
            federation=fed.config.federation,
            state_dir=state,
            config=TrainingConfig(model=model, aggregation=PLAIN),
            initial_weights=made_file,
            clock=fed.clock,
        )

    def plugin(ctx: PluginContext) -> FeddiskPlugin:
        return FeddiskPlugin(
            ctx.view,
            federation=fed.config.federation,
            made=training(ctx.view, "made"),
            classifier=training(ctx.view, "classifier"),
            config=FEDDISK,
            clock=fed.clock,
        )

    fleet = start_fleet(
        fed,
        plugin=plugin,
        training=FeddiskSpec(),
        forge=forge,
        trainer=FixedMadeTrainer,
    )
    run_out(fed, FEDDISK.verdict_timeout_s)
    return fleet


@pytest.mark.parametrize(
    ("label", "loss_total", "examples"),
    [
        ("a mean of 1e6 nats", 1e6 * 11, 11.0),  # the rise that would stop phase 1
        ("no samples", 0.0, -100.0),
        ("a crowd of samples", 0.0, 1e8),
    ],
)
def test_a_forged_made_loss_is_refused_and_phase_one_runs_as_honest(
    tmp_path: Path, label: str, loss_total: float, examples: float
) -> None:
    honest = feddisk_fleet(tmp_path / "honest", None)
    attacked = feddisk_fleet(tmp_path / "attacked", made_forge(loss_total, examples))
    try:
        for fleet in (honest, attacked):
            assert fleet.fed.coordinator.is_done
            assert fleet.plugin.made_rounds == MADE_ROUNDS  # the cap, no early stop
            assert all(r.contributed for r in fleet.plugin._made.history)
            # honest: the last judged version is the best (the loss fell each
            # round); attacked: none judged, the plugin takes the latest MADE
            assert fleet.plugin.best_version == MADE_ROUNDS
        fed = attacked.fed
        judged = range(2, MADE_ROUNDS + 2)  # round r judges version r - 1 first
        assert refusals(fed, MADE_LOSS) == {r: set(fed.device_ids) for r in judged}
        assert refusals(honest.fed, MADE_LOSS) == {}
        assert fed.messages("made_verdict") == []  # nothing judged on a forged loss
        for device in honest_ids(fed):
            stopper = fed.devices[device].method(FedDisk).stopper
            assert stopper.rounds == 0 and not stopper.stopped
        assert len(honest.fed.messages("made_verdict")) == len(judged)
    finally:
        for fleet in (honest, attacked):
            fleet.fed.close()
            assert fleet.fed.bus.handler_errors == 0


def test_a_report_of_another_ciphertext_count_costs_only_its_sender(
    climb_fleet: MakeFleet,
) -> None:
    """Before: an internal error, no answer, and every mean waited its deadline."""

    def doubled(report: MeanReport, key: PaillierPublicKey) -> bytes:
        honest = encrypted_vector_from(report.ciphertext, key)
        twice = honest.ciphertexts * 2
        return type(honest)(honest.key_fingerprint, 2, 1, twice).to_bytes(key)

    attacked = climb_fleet(doubled)
    fed = attacked.fed

    assert fed.coordinator.is_done and attacked.plugin.version == ROUNDS
    bad = [m for m in fed.errors_to(ATTACKER) if m.code == "bad_ciphertext"]
    assert len(bad) == ROUNDS and "2 ciphertexts" in bad[0].reason
    honest_count = DEVICES - 1
    assert [r.before_training for r in attacked.plugin.history] == [
        {"climb": honest_count}
    ] * ROUNDS
    assert [m.num_parties for _, m in fed.messages("mean_sum")] == [
        honest_count
    ] * ROUNDS
    assert refusals(fed, CLIMB_DUAL) == {}  # honest sums, applied
    for _, _, scale in honest_scales(attacked):
        assert 0.0 <= scale <= CLIMB.max_weight


def test_inside_the_honest_range_one_party_decides_the_made_stop(
    tmp_path: Path,
) -> None:
    """Forged means of -loss_bound, then +loss_bound: a rise, phase 1 stops early."""
    bound, most = MADE_CODEC.loss_bound, float(MADE_CODEC.max_examples)
    low, high = made_forge(-bound * most, most), made_forge(bound * most, most)
    calls: list[bytes] = []

    def rising(report: MeanReport, key: PaillierPublicKey) -> bytes:
        calls.append((low if not calls else high)(report, key))
        return calls[-1]

    attacked = feddisk_fleet(tmp_path / "attacked", rising)
    fed = attacked.fed
    try:
        assert fed.coordinator.is_done and refusals(fed, MADE_LOSS) == {}
        # version 1 judged best (the forged low), version 2 a rise: stop
        assert attacked.plugin.made_rounds == 2 < MADE_ROUNDS
        assert attacked.plugin.best_version == 1
    finally:
        fed.close()
        assert fed.bus.handler_errors == 0


def test_inside_the_honest_range_one_party_sets_the_fleet_accuracy(
    tmp_path: Path,
) -> None:
    """One device's worth of forged counts: the most samples per class, all wrong."""
    wrong = [0.0] * CLASSES + [float(MAX_EVAL_COUNT)] * CLASSES + [1.0]
    attacked = eval_fleet(tmp_path / "attacked", eval_forge(wrong))
    fed = attacked.fed
    try:
        assert fed.coordinator.is_done and refusals(fed, FLEET_EVAL) == {}
        accuracy = federated_evals(attacked)[2]["accuracy"]
        honest_samples = (DEVICES - 1) * 2 * CLASSES
        forged = CLASSES * MAX_EVAL_COUNT
        assert accuracy == pytest.approx(
            0.9 * honest_samples / (honest_samples + forged)
        )
    finally:
        fed.close()
        assert fed.bus.handler_errors == 0
