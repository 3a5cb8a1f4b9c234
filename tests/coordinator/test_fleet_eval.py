"""Federated evaluation's coordinator step: blind sums, the agent's signed result."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from ursa.coordinator.before_training import RoundInfo, StepContext
from ursa.coordinator.config import EvaluationConfig
from ursa.coordinator.fleet_eval import FleetEvaluation, fleet_accuracy
from ursa.coordinator.plugin import EpochView
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.crypto.encoding import FixedPoint
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    decrypt_real_sum,
    encrypt_reals,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.messages import (
    FLEET_EVAL,
    MAX_EVAL_COUNT,
    BaseMessage,
    ErrorCode,
    MeanReport,
    MeanRequest,
    MeanResult,
    MeanSum,
)
from ursa.protocol.router import Dispatch, RejectedError, Router

FED = "fed"
DEVICES = ("d0", "d1", "d2")
CLASSES = 3
PARTIES = 10
CODEC = FixedPoint(bound=float(MAX_EVAL_COUNT), scale_bits=0)
ROUND = RoundInfo(3, "classifier", 2, ("d0", "d1"))
COUNTS = {  # [correct.., total.., evaluated] per device: the known plaintext
    "d0": [5, 0, 1, 6, 0, 2, 1],
    "d1": [0, 3, 0, 0, 4, 1, 1],
    "d2": [1, 1, 0, 2, 1, 0, 1],
}

Keys = tuple[PaillierPublicKey, PaillierSecretKey]


@pytest.fixture(scope="module")
def keys() -> Keys:
    return generate_keypair(512)  # test-only key size


@pytest.fixture(scope="module")
def agent() -> DeviceIdentity:
    return DeviceIdentity.generate("d1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeView:
    epoch: EpochView
    store: CoordinatorStore
    online: frozenset[str] = frozenset(DEVICES)

    def epoch_view(self) -> EpochView:
        return self.epoch

    def online_devices(self) -> frozenset[str]:
        return self.online


@dataclass
class Harness:
    tmp_path: Path
    public: PaillierPublicKey
    agent: DeviceIdentity
    sent: list[BaseMessage] = field(default_factory=list)
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        epoch = EpochView(4, self.public, frozenset(DEVICES), "d1", self.agent.public())
        self.view = FakeView(epoch, CoordinatorStore(self.tmp_path / DB_FILENAME))
        self.step = FleetEvaluation(
            StepContext(FED, self.view, self.send, self.clock),
            EvaluationConfig(every=2, timeout_s=30),
            num_classes=CLASSES,
            max_parties=PARTIES,
        )
        self.router = Router("coordinator")
        self.step.register(self.router)

    def send(self, message: BaseMessage, device: str | None) -> None:
        assert device is None
        self.sent.append(decode(encode(message)))  # the wire round trip

    def report(self, device: str) -> None:
        vector = encrypt_reals(self.public, CODEC, PARTIES, COUNTS[device])
        message = MeanReport(
            federation=FED,
            round=ROUND.round,
            sender=device,
            purpose=FLEET_EVAL,
            epoch=4,
            model=ROUND.model,
            model_version=ROUND.version,
            ciphertext=vector.to_bytes(self.public),
        )
        assert self.router.dispatch(decode(encode(message))) is Dispatch.HANDLED

    def result(
        self,
        values: list[float],
        *,
        sender: str = "d1",
        parties: int = 3,
        sign: bool = True,
    ) -> MeanResult:
        message = MeanResult(
            federation=FED,
            round=ROUND.round,
            sender=sender,
            purpose=FLEET_EVAL,
            epoch=4,
            model=ROUND.model,
            model_version=ROUND.version,
            values=tuple(values),
            num_parties=parties,
        )
        if sign:
            signature = self.agent.sign(signing_bytes(message))
            message = message.model_copy(update={"signature": signature})
        return message


@pytest.fixture
def harness(tmp_path: Path, keys: Keys, agent: DeviceIdentity) -> Iterator[Harness]:
    made = Harness(tmp_path, keys[0], agent)
    yield made
    made.view.store.close()


def test_due_every_nth_round_after_the_first() -> None:
    no_round = cast(StepContext, None)  # is_due reads no context
    step = FleetEvaluation(
        no_round, EvaluationConfig(every=2), num_classes=3, max_parties=4
    )
    assert [r for r in range(1, 8) if step.is_due(r)] == [3, 5, 7]
    never = FleetEvaluation(no_round, EvaluationConfig(), num_classes=3, max_parties=4)
    assert not any(never.is_due(r) for r in range(1, 8))
    assert FleetEvaluation.signed is False


def test_fleet_accuracy_pools_the_counts_and_leaves_unseen_classes_out() -> None:
    figures = fleet_accuracy((6.0, 4.0, 0.0, 8.0, 5.0, 0.0, 2.0))
    assert figures["accuracy"] == pytest.approx(10 / 13)
    assert figures["per_class"] == [pytest.approx(0.75), pytest.approx(0.8), None]
    assert figures["samples"] == 13 and figures["evaluated"] == 2
    assert fleet_accuracy((0.0, 0.0, 0.0))["accuracy"] is None


def test_the_sum_is_blind_and_decrypts_to_the_plaintext_total(
    harness: Harness, keys: Keys
) -> None:
    phase = harness.step.open(ROUND, harness.clock.now)
    assert phase is not None
    requests = [m for m in harness.sent if isinstance(m, MeanRequest)]
    assert [(r.purpose, r.model_version) for r in requests] == [(FLEET_EVAL, 2)]
    for device in DEVICES:
        harness.report(device)
    assert harness.step.is_done(ROUND.round)
    (summed,) = [m for m in harness.sent if isinstance(m, MeanSum)]
    vector = encrypted_vector_from(summed.ciphertext, keys[0])
    totals = decrypt_real_sum(keys[1], CODEC, PARTIES, vector)
    expected = np.sum([COUNTS[d] for d in DEVICES], axis=0)
    assert np.array_equal(totals, expected) and summed.num_parties == 3


def test_the_agents_signed_result_lands_in_the_round_metrics(harness: Harness) -> None:
    harness.step.open(ROUND, harness.clock.now)
    for device in DEVICES:
        harness.report(device)
    assert harness.step.metrics(ROUND.round) == {}
    totals = [float(v) for v in np.sum([COUNTS[d] for d in DEVICES], axis=0)]
    assert harness.router.dispatch(decode(encode(harness.result(totals)))) is (
        Dispatch.HANDLED
    )
    figures = harness.step.metrics(ROUND.round)["federated_eval"]
    assert figures["version"] == 2 and figures["parties"] == 3
    assert figures["accuracy"] == pytest.approx(11 / 16) and figures["evaluated"] == 3
    harness.step.close(ROUND.round)
    assert harness.step.metrics(ROUND.round) == {}


@pytest.mark.parametrize(
    ("sender", "sign", "parties", "code"),
    [
        ("d0", True, 3, ErrorCode.UNAUTHORISED),
        ("d1", False, 3, ErrorCode.BAD_SIGNATURE),
        ("d1", True, 2, ErrorCode.MALFORMED),
    ],
)
def test_a_result_not_from_the_agent_or_not_for_the_sum_is_refused(
    harness: Harness, sender: str, sign: bool, parties: int, code: ErrorCode
) -> None:
    harness.step.open(ROUND, harness.clock.now)
    for device in DEVICES:
        harness.report(device)
    message = harness.result([1.0] * 7, sender=sender, sign=sign, parties=parties)
    with pytest.raises(RejectedError) as refused:
        harness.router.dispatch(message)
    assert refused.value.code == code
    assert harness.step.metrics(ROUND.round) == {}


@pytest.mark.parametrize(
    "values",
    [
        [2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0],  # class 0: 2 correct of 1
        [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 4.0],  # 4 evaluating among 3 parties
    ],
)
def test_an_agents_result_no_honest_sum_gives_is_refused(
    harness: Harness, values: list[float]
) -> None:
    harness.step.open(ROUND, harness.clock.now)
    for device in DEVICES:
        harness.report(device)
    with pytest.raises(RejectedError, match="no honest sum of 3 reports") as refused:
        harness.router.dispatch(harness.result(values))
    assert refused.value.code == ErrorCode.MALFORMED
    assert harness.step.metrics(ROUND.round) == {}


def test_a_result_before_the_sum_is_late(harness: Harness) -> None:
    harness.step.open(ROUND, harness.clock.now)
    harness.report("d0")
    with pytest.raises(RejectedError) as refused:
        harness.router.dispatch(harness.result([1.0] * 7))
    assert refused.value.code == ErrorCode.LATE
