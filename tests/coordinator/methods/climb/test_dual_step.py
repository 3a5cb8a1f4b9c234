"""CLIMB's dual step on a fake clock and a coordinator store: restarts, refusals."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from ursa.coordinator.aggregation import Weighting
from ursa.coordinator.before_training import RoundInfo, StepBuilder, StepContext
from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods_config import ClimbSpec
from ursa.coordinator.phase import PhaseStatus
from ursa.coordinator.plugin import EpochView, PluginContext
from ursa.coordinator.step_runner import StepRunner
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.edge_sdk.methods.climb import dual as device_climb
from ursa.models.weights import arrays_to_bytes
from ursa.protocol.envelope import decode, encode
from ursa.protocol.messages import (
    CLIMB_DUAL,
    BaseMessage,
    ErrorCode,
    MeanReport,
    MeanRequest,
    MeanSum,
    ModelUpdate,
)
from ursa.protocol.router import Dispatch, RejectedError, Router

FED = "fed"
DEVICES = ("d0", "d1", "d2")
CODEC = device_climb.ClimbConfig(max_parties=10)
SPEC = ClimbSpec(dual_timeout_s=30.0, max_parties=10)
ROUND = RoundInfo(1, "classifier", 4, ("d0", "d1"))

Keys = tuple[PaillierPublicKey, PaillierSecretKey]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)  # test-only key size


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeView:
    epoch: EpochView | None
    store: CoordinatorStore
    online: frozenset[str] = frozenset(DEVICES)

    def epoch_view(self) -> EpochView | None:
        return self.epoch

    def online_devices(self) -> frozenset[str]:
        return self.online


@dataclass
class Harness:
    """A dual step on a fake view, clock and the store of a state dir."""

    tmp_path: Path
    public: PaillierPublicKey
    spec: ClimbSpec = SPEC
    sent: list[BaseMessage] = field(default_factory=list)
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        epoch = EpochView(2, self.public, frozenset(DEVICES))
        self.view = FakeView(epoch, self.open_store())
        self.step, self.router = self.start()

    def open_store(self) -> CoordinatorStore:
        return CoordinatorStore(self.tmp_path / DB_FILENAME)

    def start(self) -> tuple[ClimbDualStep, Router]:
        step = ClimbDualStep(
            StepContext(FED, self.view, self.send, self.clock), self.spec
        )
        router = Router("coordinator")
        step.register(router)
        return step, router

    def restart(self) -> None:
        """A restarted coordinator: the store reopened, a new step."""
        self.view.store.close()
        self.view.store = self.open_store()
        self.step, self.router = self.start()

    def send(self, message: BaseMessage, device: str | None) -> None:
        assert device is None
        self.sent.append(decode(encode(message)))  # the wire round trip

    def report(self, device: str, f: float, lam: float, round_index: int = 1) -> None:
        payload = device_climb.encrypt_dual_report(self.public, CODEC, f, lam)
        message = MeanReport(
            federation=FED,
            round=round_index,
            sender=device,
            purpose=CLIMB_DUAL,
            epoch=2,
            model=ROUND.model,
            model_version=ROUND.version,
            ciphertext=payload.to_bytes(self.public),
        )
        assert self.router.dispatch(message) is Dispatch.HANDLED

    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        self.step.on_tick(ROUND.round, self.clock.now)

    def close(self) -> None:
        self.view.store.close()


@pytest.fixture
def harness(tmp_path: Path, keys: Keys) -> Iterator[Harness]:
    made = Harness(tmp_path, keys[0])
    yield made
    made.close()


def means(secret: PaillierSecretKey, summed: MeanSum) -> tuple[float, float]:
    vector = encrypted_vector_from(summed.ciphertext, secret.public_key)
    result = device_climb.decrypt_dual_means(secret, CODEC, vector)
    return result.mean_loss, result.mean_lambda


def test_a_due_round_asks_everyone_and_sums_blind(harness: Harness, keys: Keys) -> None:
    phase = harness.step.open(ROUND, harness.clock())

    assert phase is not None and phase.status is PhaseStatus.OPEN
    (request,) = harness.sent
    assert isinstance(request, MeanRequest)
    assert (request.round, request.epoch, request.model_version) == (1, 2, 4)
    assert harness.view.store.phase_keys() == ["climb.dual/classifier/1"]
    values = {"d0": (0.5, 0.0), "d1": (1.0, 1.0), "d2": (3.0, 2.0)}
    for device, (f, lam) in values.items():
        assert not harness.step.is_done(1)
        harness.report(device, f, lam)

    assert harness.step.is_done(1) and phase.status is PhaseStatus.DONE
    assert set(phase.answered) == set(DEVICES)
    summed = harness.sent[-1]
    assert isinstance(summed, MeanSum) and summed.num_parties == 3
    assert means(keys[1], summed) == pytest.approx((1.5, 1.0), abs=1e-6)
    harness.step.close(1)
    assert harness.view.store.phase_keys() == []


def test_rounds_between_periods_and_rounds_without_a_key_have_no_step(
    tmp_path: Path, keys: Keys
) -> None:
    harness = Harness(tmp_path, keys[0], spec=ClimbSpec(dual_period=2))
    try:
        assert [harness.step.is_due(r) for r in (1, 2, 3, 4)] == [
            True,
            False,
            True,
            False,
        ]
        second = RoundInfo(2, "classifier", 4, ("d0",))
        assert harness.step.open(second, harness.clock()) is None
        assert harness.step.is_done(2) and harness.sent == []
        harness.view.epoch = EpochView(2, None, frozenset(DEVICES))
        assert harness.step.open(ROUND, harness.clock()) is None
        assert harness.sent == [] and harness.view.store.phase_keys() == []
    finally:
        harness.close()


def test_a_restart_mid_step_resumes_from_the_record_without_double_counting(
    harness: Harness, keys: Keys
) -> None:
    harness.step.open(ROUND, harness.clock())
    harness.report("d0", 0.5, 0.0)
    harness.report("d1", 1.0, 1.0)
    harness.tick(20.0)  # 10 s before the deadline

    harness.restart()
    harness.sent.clear()
    phase = harness.step.open(ROUND, harness.clock())

    assert phase is not None and set(phase.answered) == {"d0", "d1"}
    assert [type(m) for m in harness.sent] == [MeanRequest]  # asked again
    harness.tick(20.0)  # a fresh deadline: still open
    assert not harness.step.is_done(1)
    harness.report("d0", 9.0, 9.0)  # re-sent after the restart: ignored
    harness.report("d2", 3.0, 2.0)
    summed = harness.sent[-1]
    assert isinstance(summed, MeanSum) and summed.num_parties == 3
    assert means(keys[1], summed) == pytest.approx((1.5, 1.0), abs=1e-6)


def test_a_restart_after_the_sum_sends_the_sum_again(harness: Harness) -> None:
    harness.step.open(ROUND, harness.clock())
    for device in DEVICES:
        harness.report(device, 1.0, 0.0)
    (summed,) = [m for m in harness.sent if isinstance(m, MeanSum)]

    harness.restart()
    harness.sent.clear()
    phase = harness.step.open(ROUND, harness.clock())

    assert phase is not None and phase.status is PhaseStatus.DONE
    assert harness.step.is_done(1)
    (resent,) = harness.sent
    assert isinstance(resent, MeanSum)
    assert (resent.ciphertext, resent.num_parties) == (summed.ciphertext, 3)


def test_a_duplicate_report_is_ignored(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    phase = harness.step.open(ROUND, harness.clock())
    harness.report("d0", 0.5, 0.0)
    record = harness.view.store.phase("climb.dual/classifier/1")

    harness.report("d0", 0.5, 0.0)

    assert phase is not None and set(phase.answered) == {"d0"}
    assert harness.view.store.phase("climb.dual/classifier/1") == record
    assert "second climb.dual report of d0 ignored" in caplog.text


def test_a_late_report_is_refused_with_late(harness: Harness) -> None:
    harness.step.open(ROUND, harness.clock())
    harness.report("d0", 0.5, 0.0)
    harness.tick(31.0)  # the deadline: summed with what arrived
    assert harness.step.is_done(1)
    assert [m.num_parties for m in harness.sent if isinstance(m, MeanSum)] == [1]

    for round_index in (1, 2):
        with pytest.raises(RejectedError) as refused:
            harness.report("d1", 1.0, 0.0, round_index)
        assert refused.value.code == ErrorCode.LATE
        assert f"round {round_index} has no open climb.dual" in refused.value.reason


def test_nobody_reporting_falls_back_without_a_sum(harness: Harness) -> None:
    phase = harness.step.open(ROUND, harness.clock())
    harness.tick(29.0)
    assert not harness.step.is_done(1)
    harness.tick(1.0)

    assert harness.step.is_done(1)
    assert phase is not None and phase.status is PhaseStatus.FALLBACK
    assert [type(m) for m in harness.sent] == [MeanRequest]
    record = harness.view.store.phase("climb.dual/classifier/1")
    assert record is not None and record["status"] == "fallback"


def test_a_device_going_offline_is_not_waited_for(harness: Harness) -> None:
    harness.step.open(ROUND, harness.clock())
    harness.report("d0", 1.0, 0.0)
    harness.report("d1", 2.0, 0.0)
    harness.view.online = frozenset({"d0", "d1"})  # d2's last will

    harness.tick(1.0)

    assert harness.step.is_done(1)
    assert [m.num_parties for m in harness.sent if isinstance(m, MeanSum)] == [2]


def test_an_unscaled_delta_is_noted(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    update = ModelUpdate(
        federation=FED,
        round=1,
        sender="d0",
        base_version=4,
        num_examples=3,
        weights=b"x",
    )
    harness.step.on_update(1, "d0", update.model_copy(update={"delta_scaled": True}))
    assert "unscaled" not in caplog.text
    harness.step.on_update(1, "d0", update)
    assert "d0 sent an unscaled delta (w=1)" in caplog.text


# --- composed into the runtime's steps -----------------------------------------------


def runner(store: CoordinatorStore, *steps: StepBuilder) -> StepRunner:
    """The runtime's steps, as the service builds them."""
    ctx = StepContext(FED, FakeView(None, store), lambda m, d: None, lambda: 0.0)
    return StepRunner(ctx, steps)


def plugin(
    tmp_path: Path, store: CoordinatorStore, *steps: StepBuilder
) -> TrainingPlugin:
    initial = tmp_path / "w.ursw"
    initial.write_bytes(arrays_to_bytes({"w": np.zeros(2, np.float32)}))
    return TrainingPlugin(
        PluginContext(FakeView(None, store), runner(store, *steps)),
        federation=FED,
        state_dir=tmp_path / "state",
        config=TrainingConfig(),
        initial_weights=initial,
    )


def test_the_step_names_the_signed_method_and_the_weighting(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / DB_FILENAME)
    try:
        composed = plugin(tmp_path, store, ClimbDualStep.later())
        assert composed.methods() == ("climb",)
        assert composed.weighting is Weighting.CLIMB
        plain = plugin(tmp_path, store)
        assert plain.methods() == ("fedavg",) and plain.weighting is Weighting.FEDAVG
    finally:
        store.close()


def test_two_owners_of_the_dual_report_are_refused(tmp_path: Path) -> None:
    store = CoordinatorStore(tmp_path / DB_FILENAME)
    try:
        with pytest.raises(
            ValueError,
            match=r"MeanReport of purpose 'climb\.dual' is handled by 'climb'",
        ):
            runner(store, ClimbDualStep.later(), ClimbDualStep.later())
    finally:
        store.close()


def test_climb_weighting_without_its_step_is_refused() -> None:
    with pytest.raises(ValueError, match="comes with its dual step"):
        TrainingConfig(weighting=Weighting.CLIMB)
