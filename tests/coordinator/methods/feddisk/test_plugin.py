"""FedDisk rounds on the coordinator, in process: blind MADE judging, the switch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin
from ursa.coordinator.methods_config import FeddiskSpec
from ursa.coordinator.plugin import EpochView, NoSteps, PluginContext
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import (
    PaillierPublicKey,
    PaillierSecretKey,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.edge_sdk.methods.feddisk import made_loss
from ursa.models.weights import Arrays, arrays_to_bytes
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.ids import model_transfer_id
from ursa.protocol.messages import (
    MADE_LOSS,
    BaseMessage,
    ChunkRequest,
    MadeVerdict,
    MeanReport,
    MeanSum,
    ModelUpdate,
)
from ursa.protocol.router import RejectedError

PLAIN = AggregationConfig(mode="plain")
"""These tests hand the plugin plain updates: the rounds sum in the clear."""

FED = "fed"
DEVICES = ("d0", "d1", "d2")
SELECTED = ("d0", "d1")
AGENT = DeviceIdentity.generate("d0")
CODEC = made_loss.MadeLossCodec()
MADE_W: Arrays = {"w": np.array([0.5, -0.5], np.float32)}
CLASSIFIER_W: Arrays = {"c": np.zeros(3, np.float32)}

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
    """A FedDisk plugin on a state dir, a fake view and clock, what it sent."""

    tmp_path: Path
    public: PaillierPublicKey
    secret: PaillierSecretKey
    config: FeddiskSpec = field(default_factory=FeddiskSpec)
    sent: list[tuple[BaseMessage, str | None]] = field(default_factory=list)
    switches: list[tuple[int, int]] = field(default_factory=list)
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        epoch = EpochView(1, self.public, frozenset(DEVICES), "d0", AGENT.public())
        self.view = FakeView(epoch, self.open_store())
        self.plugin = self.start()

    def open_store(self) -> CoordinatorStore:
        return CoordinatorStore(self.tmp_path / "state" / DB_FILENAME)

    def restart(self) -> FeddiskPlugin:
        """A restarted coordinator: the store reopened, new plugins."""
        self.view.store.close()
        self.view.store = self.open_store()
        return self.start()

    def start(self) -> FeddiskPlugin:
        """New plugins on the state dir and the view's store."""
        state = self.tmp_path / "state"
        made_file = self.tmp_path / "made.ursw"
        made_file.write_bytes(arrays_to_bytes(MADE_W))
        classifier_file = self.tmp_path / "classifier.ursw"
        classifier_file.write_bytes(arrays_to_bytes(CLASSIFIER_W))

        def training(model: str, initial: Path) -> TrainingPlugin:
            return TrainingPlugin(
                PluginContext(self.view, NoSteps()),
                federation=FED,
                state_dir=state,
                config=TrainingConfig(
                    model=model, update_timeout_s=5.0, aggregation=PLAIN
                ),
                initial_weights=initial,
                clock=self.clock,
            )

        self.plugin = FeddiskPlugin(
            self.view,
            federation=FED,
            made=training("made", made_file),
            classifier=training("classifier", classifier_file),
            config=self.config,
            clock=self.clock,
            on_switch=lambda r, v: self.switches.append((r, v)),
        )
        return self.plugin

    def send(self, message: BaseMessage, device: str | None) -> None:
        self.sent.append((decode(encode(message)), device))

    def kinds(self) -> list[str]:
        return [m.kind for m, _ in self.sent]  # type: ignore[attr-defined]

    def of(self, kind: str) -> list[Any]:
        return [m for m, _ in self.sent if m.kind == kind]  # type: ignore[attr-defined]

    def select(self, round_index: int) -> None:
        """As the round cycle: selected, then no steps to wait on."""
        self.plugin.on_selected(round_index, SELECTED, self.send)
        self.plugin.on_steps_done(round_index, self.send)

    def deliver(self, round_index: int, message: BaseMessage) -> None:
        self.plugin.on_message(round_index, message, self.send)
        self.plugin.on_steps_done(round_index, self.send)  # the step after it

    def tick(self, round_index: int, seconds: float) -> None:
        self.clock.now += seconds
        self.plugin.on_tick(round_index, self.clock.now, self.send)
        self.plugin.on_steps_done(round_index, self.send)

    def update(self, round_index: int, device: str, model: str = "made") -> None:
        plugin = self.plugin.made if model == "made" else self.plugin.classifier
        delta = {
            k: np.full(v.shape, 0.1, np.float32)
            for k, v in plugin.global_arrays.items()
        }
        self.deliver(
            round_index,
            ModelUpdate(
                federation=FED,
                round=round_index,
                sender=device,
                model=model,
                base_version=plugin.version,
                num_examples=10,
                weights=arrays_to_bytes(delta),
            ),
        )

    def train(self, round_index: int, model: str = "made") -> None:
        for device in SELECTED:
            self.update(round_index, device, model)
        assert self.plugin.is_complete(round_index)

    def loss(
        self, round_index: int, device: str, nll: float, n: int = 10, **fields: Any
    ) -> MeanReport:
        payload = made_loss.encrypt_made_loss(self.public, CODEC, nll, n)
        values: dict[str, Any] = {
            "federation": FED,
            "round": round_index,
            "sender": device,
            "purpose": MADE_LOSS,
            "epoch": 1,
            "model": "made",
            "model_version": self.plugin.made.version,
            "ciphertext": payload.to_bytes(self.public),
        }
        values.update(fields)
        return MeanReport(**values)

    def verdict(
        self,
        round_index: int,
        *,
        stop: bool,
        best: int,
        sender: str = "d0",
        signer: DeviceIdentity = AGENT,
    ) -> MadeVerdict:
        message = MadeVerdict(
            federation=FED,
            round=round_index,
            sender=sender,
            epoch=1,
            model_version=self.plugin.made.version,
            stop=stop,
            best_version=best,
        )
        return message.model_copy(
            update={"signature": signer.sign(signing_bytes(message))}
        )

    def judge(self, round_index: int, nll: float) -> None:
        """Open the loss step of the round and have every device report."""
        self.select(round_index)
        for device in DEVICES:
            self.deliver(round_index, self.loss(round_index, device, nll))

    def fleet_loss(self, message: MeanSum) -> made_loss.FleetLoss:
        summed = encrypted_vector_from(message.ciphertext, self.public)
        return made_loss.decrypt_fleet_loss(self.secret, CODEC, summed)


@pytest.fixture
def harness(tmp_path: Path, keys: Keys) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**config: Any) -> Harness:
        made.append(Harness(tmp_path, *keys, config=FeddiskSpec(**config)))
        return made[-1]

    yield make
    for h in made:
        h.view.store.close()  # an unclosed SQLite connection warns on 3.13


def refused(h: Harness, round_index: int, message: BaseMessage) -> str:
    with pytest.raises(RejectedError) as info:
        h.deliver(round_index, message)
    return info.value.code


# --- tests ------------------------------------------------------------------------


def test_models_must_match_the_config(harness: Callable[..., Harness]) -> None:
    h = harness()
    made, classifier = h.plugin.made, h.plugin.classifier

    with pytest.raises(ValueError, match="expects 'mine'"):
        FeddiskPlugin(
            h.view,
            federation=FED,
            made=made,
            classifier=classifier,
            config=FeddiskSpec(made_model="mine"),
        )
    with pytest.raises(ValueError, match="both 'made'"):
        FeddiskPlugin(h.view, federation=FED, made=made, classifier=made)


def test_a_made_round_then_a_blind_loss_step_and_another_made_round(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    assert [m.model for m in h.of("model_available")] == ["made"]
    h.train(1)
    assert (h.plugin.made.version, h.plugin.made_rounds) == (1, 1)
    h.sent.clear()

    h.select(2)
    (request,) = h.of("mean_request")
    assert (request.round, request.epoch, request.model, request.model_version) == (
        2,
        1,
        "made",
        1,
    )
    assert h.of("transfer_manifest")[0].purpose == "made.v1"
    assert all(device is None for _, device in h.sent)
    nlls = {"d0": (2.0, 10), "d1": (-1.0, 30), "d2": (5.0, 20)}
    for device, (nll, n) in nlls.items():
        assert not h.plugin.is_complete(2) and h.of("mean_sum") == []
        h.deliver(2, h.loss(2, device, nll, n))
    (summed,) = h.of("mean_sum")
    fleet = h.fleet_loss(summed)
    assert fleet.mean_nll == pytest.approx((20 - 30 + 100) / 60, abs=1e-5)
    assert summed.num_parties == 3 and not h.plugin.is_complete(2)

    h.deliver(2, h.verdict(2, stop=False, best=1))

    assert h.plugin.phase == "made" and h.plugin.best_version == 1
    assert h.plugin.made_rounds == 2 and not h.plugin.is_complete(2)
    notice = h.of("model_available")[-1]
    assert (notice.model, notice.round, notice.model_version) == ("made", 2, 1)
    h.train(2)
    assert h.plugin.made.version == 2 and h.plugin.classifier.version == 0


def test_a_stop_verdict_switches_to_the_classifier(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    h.train(1)
    h.judge(2, 1.0)
    h.deliver(2, h.verdict(2, stop=False, best=1))
    h.train(2)
    h.sent.clear()

    h.judge(3, 1.5)
    h.deliver(3, h.verdict(3, stop=True, best=1))

    assert h.plugin.phase == "classifier" and h.plugin.switch_round == 3
    assert h.plugin.best_version == 1 and h.switches == [(3, 1)]
    (switch,) = h.of("feddisk_switch")
    assert (switch.round, switch.made_model, switch.made_version, switch.model) == (
        3,
        "made",
        1,
        "classifier",
    )
    manifests = [(m.purpose, to) for m, to in h.sent if m.kind == "transfer_manifest"]
    assert manifests == [
        ("made.v2", None),  # for the loss step: every device judges it
        *(("classifier.v0", device) for device in SELECTED),  # the selected train
    ]
    notice = h.of("model_available")[-1]
    assert (notice.model, notice.round, notice.model_version) == ("classifier", 3, 0)
    assert refused(h, 3, h.loss(3, "d1", 1.0)) == "late"
    h.train(3, "classifier")
    assert h.plugin.classifier.version == 1 and h.plugin.made.version == 2
    assert h.plugin.made_rounds == 2


def test_updates_go_to_the_model_being_trained(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)

    assert refused(h, 1, _update_for(h, "classifier")) == "malformed"
    h.train(1)
    h.judge(2, 1.0)
    assert refused(h, 2, _update_for(h, "made")) == "late"  # still judging
    assert h.plugin.made.history[-1].round == 1


def _update_for(h: Harness, model: str) -> ModelUpdate:
    return ModelUpdate(
        federation=FED,
        round=1,
        sender="d0",
        model=model,
        base_version=0,
        num_examples=3,
        weights=arrays_to_bytes(CLASSIFIER_W if model == "classifier" else MADE_W),
    )


def test_loss_deadline_sums_who_reported_and_no_verdict_trains_on(
    harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(loss_timeout_s=10.0, verdict_timeout_s=5.0)
    caplog.set_level(logging.INFO, logger="ursa.coordinator.feddisk")
    h.select(1)
    h.train(1)
    h.select(2)
    h.deliver(2, h.loss(2, "d0", 3.0))
    h.deliver(2, h.loss(2, "d2", 1.0))

    h.tick(2, 9.0)
    assert h.of("mean_sum") == []
    h.tick(2, 2.0)
    (summed,) = h.of("mean_sum")
    assert summed.num_parties == 2
    assert h.fleet_loss(summed).mean_nll == pytest.approx(2.0, abs=1e-5)
    assert refused(h, 2, h.loss(2, "d1", 1.0)) == "late"
    h.tick(2, 4.0)
    assert not h.plugin.is_complete(2) and h.plugin.made_rounds == 1
    h.tick(2, 2.0)

    assert "no verdict on made version 1" in caplog.text
    assert h.plugin.made_rounds == 2 and h.plugin.best_version is None
    assert h.of("model_available")[-1].round == 2


def test_an_offline_device_is_not_waited_for_and_nobody_means_no_sum(
    harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    h = harness()
    h.select(1)
    h.train(1)
    h.view.online = frozenset({"d1"})
    h.select(2)
    h.deliver(2, h.loss(2, "d1", 1.0))
    assert h.of("mean_sum")[0].num_parties == 1
    h.deliver(2, h.verdict(2, stop=False, best=1))
    h.train(2)

    h.view.online = frozenset()
    h.select(3)

    assert "no loss report on made version 2; training on" in caplog.text
    assert len(h.of("mean_sum")) == 1 and h.plugin.made_rounds == 3
    assert h.of("model_available")[-1].round == 3


def test_a_last_will_mid_loss_step_closes_it_with_who_reported(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    h.train(1)
    h.select(2)
    h.deliver(2, h.loss(2, "d0", 3.0))
    h.deliver(2, h.loss(2, "d1", 1.0))
    assert h.of("mean_sum") == []

    h.view.online = frozenset({"d0", "d1"})  # d2's last will
    h.tick(2, 0.0)

    (summed,) = h.of("mean_sum")
    assert summed.num_parties == 2
    assert h.fleet_loss(summed).mean_nll == pytest.approx(2.0, abs=1e-5)


def test_bad_loss_reports_and_verdicts_are_refused(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    assert refused(h, 1, h.loss(1, "d0", 1.0)) == "late"  # no loss step
    h.train(1)
    h.select(2)
    good = h.loss(2, "d0", 1.0)

    assert refused(h, 2, h.loss(2, "d0", 1.0, epoch=2)) == "wrong_epoch"
    assert refused(h, 2, h.loss(2, "d0", 1.0, model_version=0)) == "wrong_version"
    assert refused(h, 2, h.loss(2, "outsider", 1.0)) == "unauthorised"
    garbage = good.model_copy(update={"ciphertext": b"\x00" * 40})
    assert refused(h, 2, garbage) == "bad_ciphertext"
    assert refused(h, 2, h.verdict(2, stop=True, best=1)) == "late"  # no sum yet
    h.deliver(2, good)
    h.deliver(2, h.loss(2, "d0", 7.0))  # a duplicate: ignored
    h.deliver(2, h.loss(2, "d1", 1.0))
    h.deliver(2, h.loss(2, "d2", 1.0))
    assert h.fleet_loss(h.of("mean_sum")[0]).mean_nll == pytest.approx(1.0)

    other = DeviceIdentity.generate("d1")
    impostor = h.verdict(2, stop=True, best=1, sender="d1", signer=other)
    assert refused(h, 2, impostor) == "unauthorised"
    assert refused(h, 2, h.verdict(2, stop=True, best=1, signer=other)) == (
        "bad_signature"
    )
    assert refused(h, 2, h.verdict(2, stop=True, best=2)) == "malformed"
    assert h.plugin.phase == "made" and not h.plugin.is_complete(2)


def test_the_round_cap_switches_with_the_last_best_version(
    harness: Callable[..., Harness],
) -> None:
    h = harness(max_made_rounds=2, verdict_timeout_s=5.0)
    h.select(1)
    h.train(1)
    h.judge(2, 2.0)
    h.deliver(2, h.verdict(2, stop=False, best=1))
    h.train(2)

    h.judge(3, 1.0)
    h.tick(3, 6.0)  # no verdict

    assert h.plugin.phase == "classifier" and h.plugin.made_rounds == 2
    assert h.switches == [(3, 1)] and h.of("feddisk_switch")[0].made_version == 1


def test_the_cap_without_any_verdict_keeps_the_latest_version(
    harness: Callable[..., Harness],
) -> None:
    h = harness(max_made_rounds=1, verdict_timeout_s=5.0)
    h.select(1)
    h.train(1)

    h.judge(2, 2.0)
    h.tick(2, 6.0)

    assert h.switches == [(2, 1)] and h.plugin.best_version == 1
    assert h.of("feddisk_switch")[0].made_version == 1
    assert h.of("model_available")[-1].model == "classifier"


def test_without_a_key_epoch_the_loss_step_is_skipped(
    harness: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    h = harness()
    h.select(1)
    h.train(1)
    h.view.epoch = replace(h.view.epoch, public_key=None)  # type: ignore[type-var]

    h.select(2)

    assert "no key epoch; made version 1 is not judged" in caplog.text
    assert h.of("mean_request") == [] and h.plugin.made_rounds == 2
    h.train(2)


def test_a_restart_mid_loss_step_resumes_the_encrypted_sum(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    h.train(1)
    h.select(2)
    h.deliver(2, h.loss(2, "d0", 4.0, 10))

    h.restart()
    h.sent.clear()
    h.select(2)
    h.select(2)  # idempotent

    assert [m.model_version for m in h.of("mean_request")] == [1, 1]
    h.deliver(2, h.loss(2, "d0", 99.0, 10))  # the re-sent report: a duplicate
    h.deliver(2, h.loss(2, "d1", 2.0, 10))
    h.deliver(2, h.loss(2, "d2", 0.0, 20))
    (summed,) = h.of("mean_sum")
    assert summed.num_parties == 3
    assert h.fleet_loss(summed).mean_nll == pytest.approx(1.5, abs=1e-5)

    h.restart()  # waiting for the verdict
    h.sent.clear()
    h.select(2)
    assert h.kinds()[-1] == "mean_sum" and not h.plugin.is_complete(2)
    assert h.view.store.phase_keys() == [
        "feddisk.made_loss/made/2",
        "feddisk.verdict/made/2",
    ]
    h.deliver(2, h.verdict(2, stop=False, best=1))
    assert h.plugin.made_rounds == 2 and h.view.store.phase_keys() == []

    h.restart()  # mid MADE round: no second loss step, no double count
    h.sent.clear()
    h.select(2)
    assert h.of("mean_request") == [] and h.plugin.made_rounds == 2
    h.train(2)


def test_a_restart_after_the_switch_stays_on_the_classifier(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    h.train(1)
    h.judge(2, 1.0)
    h.deliver(2, h.verdict(2, stop=False, best=1))
    h.train(2)
    h.judge(3, 3.0)
    h.deliver(3, h.verdict(3, stop=True, best=1))
    h.train(3, "classifier")

    h.restart()
    h.sent.clear()
    h.select(4)

    assert h.plugin.phase == "classifier" and h.plugin.switch_round == 3
    assert h.plugin.best_version == 1 and h.plugin.made_rounds == 2
    (switch,) = h.of("feddisk_switch")
    assert switch.made_version == 1 and h.switches == [(3, 1)]
    h.train(4, "classifier")
    assert h.plugin.classifier.version == 2


def test_chunk_requests_reach_whoever_published_the_transfer(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    h.train(1)
    h.judge(2, 1.0)

    def ask(model: str, version: int) -> list[str]:
        h.sent.clear()
        h.clock.now += 1.0  # a device asks every retry_s (2 s), at most 1 per 0.5 s
        request = ChunkRequest(
            federation=FED,
            round=2,
            sender="d2",
            transfer_id=model_transfer_id(FED, model, version),
            indices=(0,),
        )
        h.deliver(2, request)
        assert all(device == "d2" for _, device in h.sent)
        return h.kinds()

    assert ask("made", 1) == ["transfer_manifest", "chunk"]  # the loss step's
    assert ask("made", 0) == ["transfer_manifest", "chunk"]  # the MADE round's
    with pytest.raises(RejectedError, match="not a current model version"):
        ask("classifier", 0)
    h.deliver(2, h.verdict(2, stop=True, best=1))
    assert ask("classifier", 0) == ["transfer_manifest", "chunk"]
    assert ask("made", 0) == ["transfer_manifest", "chunk"]  # the other plugin


def test_a_judged_version_is_not_judged_again(
    harness: Callable[..., Harness],
) -> None:
    h = harness()
    h.select(1)
    h.select(1)  # idempotent: one MADE round
    assert h.plugin.made_rounds == 1
    h.train(1)
    h.judge(2, 1.0)
    h.deliver(2, h.verdict(2, stop=False, best=1))
    h.tick(2, 6.0)  # the update deadline: nobody trained, the MADE stays at 1
    assert h.plugin.is_complete(2) and h.plugin.made.version == 1
    h.sent.clear()

    h.select(3)

    assert h.of("mean_request") == [] and h.plugin.made_rounds == 3
    assert h.of("model_available")[-1].round == 3
