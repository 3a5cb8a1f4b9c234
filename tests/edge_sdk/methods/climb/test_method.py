"""Climb on a fake device context: reports, the dual step, waiting, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    encrypted_vector_from,
    generate_keypair,
    sum_encrypted,
)
from ursa.edge_sdk.climb import (
    ClimbConfig,
    apply_dual_means,
    decrypt_dual_means,
    encrypt_dual_report,
    plain_dual_means,
)
from ursa.edge_sdk.device_core import DeviceStats, TrainingStats
from ursa.edge_sdk.method import EpochKeys, TrainPlan
from ursa.edge_sdk.methods.climb import DUAL_WAIT_S, Climb
from ursa.edge_sdk.state import DeviceStateDir
from ursa.edge_sdk.trainer import LocalDelta, ModelTrainer
from ursa.models.weights import Arrays
from ursa.protocol.messages import (
    BaseMessage,
    ClimbStats,
    ClimbSum,
    DualStepRequest,
    ErrorReply,
    KeyEpochStart,
)
from ursa.protocol.router import Dispatch, NotReadyError, Router

CONFIG = ClimbConfig(eta_d=0.5)
FED = "fed"
VERSION: Arrays = {"w": np.array([0.5, -0.25], np.float32)}


class FixedLoss(ModelTrainer):
    def __init__(self, loss: float) -> None:
        self.loss = loss

    def train_delta(
        self, round_index: int, global_arrays: Arrays, *, delta_scale: float
    ) -> LocalDelta:
        return LocalDelta({k: v * delta_scale for k, v in global_arrays.items()}, 1)

    def local_loss(self, global_arrays: Arrays) -> float:
        return self.loss


class FakeContext:
    """A `DeviceContext` by hand: a model cache, an outbox list, a fake clock."""

    def __init__(self, tmp: Path, keys: tuple[PaillierPublicKey, PaillierSecretKey]):
        self.device_id = "d0"
        self.federation = FED
        self.store = DeviceStateDir(tmp / "d0")
        self.stats = DeviceStats()
        self.training_stats = TrainingStats()
        self.trainer = FixedLoss(0.8)
        self.model_version: int | None = None
        self.arrays: dict[int, Arrays] = {}
        self.sent: list[BaseMessage] = []
        self.wanted: list[int] = []
        self.retries = 0
        self.notice_age = 0.0
        public, secret = keys
        self.epoch = KeyEpochStart.model_construct(epoch=3)  # only its number
        self.epoch_keys: EpochKeys | None = EpochKeys(self.epoch, public, secret, None)

    def send(self, message: BaseMessage) -> None:
        self.sent.append(message)

    def signed(self, message: BaseMessage) -> BaseMessage:
        return message

    def keys(self, epoch: int) -> EpochKeys:
        if self.epoch_keys is None or epoch > self.epoch.epoch:
            raise NotReadyError
        return self.epoch_keys

    def current_keys(self) -> EpochKeys | None:
        return self.epoch_keys

    def model_arrays_at(self, version: int) -> Arrays | None:
        if version in self.arrays:
            return self.arrays[version]
        self.wanted.append(version)
        return None

    def seconds_since_model_notice(self) -> float:
        return self.notice_age

    def retry_training(self) -> None:
        self.retries += 1

    def forget_downloads(self) -> None:
        self.arrays.clear()


@pytest.fixture(scope="module")
def keys() -> tuple[PaillierPublicKey, PaillierSecretKey]:
    return generate_keypair(512)  # the logic, not the security


def attached(tmp_path: Path, keys: Any) -> tuple[Climb, FakeContext, Router]:
    ctx, router, climb = FakeContext(tmp_path, keys), Router("d0"), Climb(CONFIG)
    climb.attach(ctx, router)
    climb.start()
    return climb, ctx, router


def request(round_index: int = 2, version: int = 1) -> DualStepRequest:
    return DualStepRequest(
        federation=FED, round=round_index, sender="coordinator", epoch=3,
        model_version=version,
    )  # fmt: skip


def climb_sum(
    public: PaillierPublicKey, reports: list[bytes], round_index: int = 2
) -> ClimbSum:
    vectors = [encrypted_vector_from(r, public) for r in reports]
    total = sum_encrypted(public, vectors)
    return ClimbSum(
        federation=FED, round=round_index, sender="coordinator", epoch=3,
        stats_sum=total.to_bytes(public), num_parties=len(reports),
    )  # fmt: skip


def test_the_report_waits_for_the_version_then_encrypts_f_and_lambda(
    tmp_path: Path, keys: Any
) -> None:
    climb, ctx, router = attached(tmp_path, keys)
    router.dispatch(request(version=1))
    assert ctx.sent == [] and ctx.wanted == [1]  # downloading first

    ctx.arrays[1] = VERSION
    climb.on_model_ready()
    (report,) = ctx.sent
    assert isinstance(report, ClimbStats) and (report.epoch, report.round) == (3, 2)
    vector = encrypted_vector_from(report.stats, keys[0])  # after the bytes trip
    means = decrypt_dual_means(keys[1], CONFIG, vector)
    assert means.mean_loss == pytest.approx(0.8, abs=1e-6)
    assert means.mean_lambda == pytest.approx(0.0, abs=1e-6)

    router.dispatch(request(version=1))  # re-published: the same report again
    assert ctx.sent == [report, report]


def test_the_sum_sets_the_weight_like_the_plaintext_step_and_persists_it(
    tmp_path: Path, keys: Any
) -> None:
    climb, ctx, router = attached(tmp_path, keys)
    ctx.arrays[1] = VERSION
    router.dispatch(request())
    (mine,) = ctx.sent
    assert isinstance(mine, ClimbStats)
    other = encrypt_dual_report(keys[0], CONFIG, 0.2, 0.4).to_bytes(keys[0])
    assert not climb.ready_to_train(2)  # the dual step has not come yet

    router.dispatch(climb_sum(keys[0], [mine.stats, other]))

    expected = apply_dual_means(
        0.0, 0.8, plain_dual_means([0.8, 0.2], [0.0, 0.4], CONFIG), CONFIG
    )
    assert climb.weight == pytest.approx(expected.weight, abs=1e-5)
    assert climb.lam == pytest.approx(expected.next_lambda, abs=1e-5)
    assert climb.ready_to_train(2) and ctx.retries == 1
    plan = climb.plan(TrainPlan(2))
    assert plan.scaled and plan.delta_scale == climb.weight
    assert ctx.training_stats.dual_steps == 1

    again = Climb(CONFIG)
    again.attach(FakeContext(tmp_path, keys), Router("d0"))
    again.start()
    assert (again.lam, again.weight) == (climb.lam, climb.weight)


def test_a_silent_dual_step_holds_training_for_dual_wait_s_only(
    tmp_path: Path, keys: Any
) -> None:
    climb, ctx, router = attached(tmp_path, keys)
    ctx.arrays[1] = VERSION
    router.dispatch(request())
    ctx.notice_age = DUAL_WAIT_S - 0.1
    assert not climb.ready_to_train(2)
    assert climb.ready_to_train(3)  # another round is not held
    ctx.notice_age = DUAL_WAIT_S
    assert climb.ready_to_train(2)
    assert climb.plan(TrainPlan(2)).delta_scale == 1.0  # the previous weight


def test_a_refused_report_stops_the_wait(tmp_path: Path, keys: Any) -> None:
    climb, ctx, router = attached(tmp_path, keys)
    ctx.arrays[1] = VERSION
    router.dispatch(request())
    (report,) = ctx.sent
    refusal = ErrorReply(
        federation=FED, round=2, sender="coordinator", code="late",
        reason="the dual step is closed", in_reply_to=report.message_id,
    )  # fmt: skip
    climb.on_error_reply(refusal.model_copy(update={"in_reply_to": "f" * 32}))
    assert not climb.ready_to_train(2)
    climb.on_error_reply(refusal)
    assert climb.ready_to_train(2) and ctx.retries == 1


def test_without_the_epoch_key_a_request_waits(tmp_path: Path, keys: Any) -> None:
    _, ctx, router = attached(tmp_path, keys)
    ctx.epoch_keys = None
    assert router.dispatch(request()) is Dispatch.PARKED
    assert ctx.sent == []


def test_an_unreadable_state_resets_lambda(
    tmp_path: Path, keys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    DeviceStateDir(tmp_path / "d0").save_method_state("climb", {"lambda": "x"})
    climb, _, _ = attached(tmp_path, keys)
    assert (climb.lam, climb.weight) == (0.0, 1.0)
    assert "CLIMB state unreadable" in caplog.text
