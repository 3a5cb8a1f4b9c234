"""EdgeClient over the in-memory bus: state dir, restart, checks it makes."""

from __future__ import annotations

import logging
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from tests.edge_sdk.trainers import PlainTrainer, ShapedTrainer
from ursa.coordinator.config import CoordinatorConfig, DeadlinesConfig, EnrolmentConfig
from ursa.coordinator.methods_config import ClimbSpec, DubheSpec, FedAvgSpec
from ursa.coordinator.plugin import NoTraining, RoundPlugin
from ursa.coordinator.service import CoordinatorService
from ursa.crypto.encoding import PackingLayout
from ursa.crypto.identity import DeviceIdentity, verify_signature
from ursa.crypto.paillier import PaillierPublicKey, encrypt_vector
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.config import DeviceConfig, load_device_config
from ursa.edge_sdk.method import DeviceContext, DeviceMethod, LocalData
from ursa.edge_sdk.methods.climb.method import Climb
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.trainer import ModelTrainer, NoOpTrainer
from ursa.protocol.admission_limits import AdmissionLimits, DropReason
from ursa.protocol.envelope import decode, encode, message_digest, signing_bytes
from ursa.protocol.errors import ProtocolError
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    EnrolResult,
    ErrorReply,
    FederationEnd,
    IdentityKeys,
    ModelSpec,
    Registration,
    RingHop,
    RoundAnnounce,
    SelectionResult,
)
from ursa.protocol.router import Router
from ursa.protocol.topics import down_topic, global_topic, name_for, up_topic

FED = "fed"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A coordinator and N devices on one synchronous bus, with a spy."""

    def __init__(
        self, tmp: Path, n: int, plugin: RoundPlugin | None = None, **overrides: Any
    ) -> None:
        self.tmp, self.bus, self.clock = tmp, InMemoryBus(), Clock()
        settings: dict[str, Any] = dict(
            federation=FED,
            state_dir=tmp / "coordinator",
            enrolment=EnrolmentConfig(mode="tofu"),
            min_devices=n,
            k=2,
            tries=2,
            rounds=2,
            key_bits=512,
            seed=3,
            deadlines=DeadlinesConfig(volunteer_s=5, registration_s=5),
        )
        settings.update(overrides)
        self.coordinator = CoordinatorService(
            CoordinatorConfig(**settings),
            transport=InMemoryTransport(self.bus, "coordinator"),
            clock=self.clock,
            plugin=None if plugin is None else (lambda _ctx: plugin),
        )
        self.ids = [f"d{i}" for i in range(n)]
        self.clients: dict[str, EdgeClient] = {}
        self.captured: list[tuple[str, bytes]] = []
        spy = InMemoryTransport(self.bus, "spy")
        spy.set_handler(lambda t, p: self.captured.append((t, p)))
        spy.subscribe(f"ursa/v1/{FED}/#")
        spy.connect()
        self.raw = InMemoryTransport(self.bus, "raw")
        self.raw.connect()

    def client(
        self,
        device_id: str,
        methods: list[DeviceMethod] | None = None,
        trainer: ModelTrainer | None = None,
        **config: Any,
    ) -> EdgeClient:
        cfg = DeviceConfig(
            device_id=device_id,
            federation=FED,
            state_dir=self.tmp / device_id,
            obfuscator_pool_size=0,
            insecure_test_keys=True,
            **config,
        )
        topic, payload = device_will(cfg)
        index = int(device_id[1:])
        labels = np.r_[np.full(30, index % 10), np.arange(10)]
        client = EdgeClient(
            cfg,
            labels,
            transport=InMemoryTransport(
                self.bus, device_id, will=(topic, payload, True)
            ),
            rng=np.random.default_rng(index),
            methods=methods,
            trainer=trainer,
        )
        self.clients[device_id] = client
        return client

    def messages(self, kind: str, device: str | None = None) -> list[Any]:
        """Captured messages of `kind` (only on `device`'s down topic if given)."""
        out = []
        for topic, payload in self.captured:
            if device is not None and f"/dev/{device}/down/" not in topic:
                continue
            try:
                message = decode(payload)
            except ProtocolError:
                continue
            if message.kind == kind:
                out.append(message)
        return out

    def close(self) -> None:
        for client in self.clients.values():
            client.stop()
        self.coordinator.stop()


@pytest.fixture
def harness(tmp_path: Path) -> Any:
    made: list[Harness] = []

    def make(n: int, plugin: RoundPlugin | None = None, **overrides: Any) -> Harness:
        made.append(Harness(tmp_path, n, plugin, **overrides))
        return made[-1]

    yield make
    for h in made:
        h.close()
        assert h.bus.handler_errors == 0


def _dropping(sender: str, kind: str) -> Any:
    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        if s != sender or r != "coordinator":
            return False
        try:
            return bool(decode(payload).kind == kind)
        except ProtocolError:
            return False

    return drop


def test_state_dir_holds_identity_and_a_0600_epoch_key(harness: Any) -> None:
    h = harness(4)
    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id).start()

    assert h.coordinator.is_done
    for client in h.clients.values():
        key_file = client.link.store.secret_key_path(1)
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert stat.S_IMODE((key_file.parent / "identity.key").stat().st_mode) == 0o600
        assert client.link.store.load_coordinator() == h.coordinator.identity
        assert client.enrolled.is_set() and client.has_registry


def test_restarted_device_answers_a_round_with_the_same_draws(harness: Any) -> None:
    h = harness(4, rounds=1)

    def drop_non_agent_volunteers(s: str, r: str, topic: str, payload: bytes) -> bool:
        notices = h.messages("key_epoch_start")
        agent = notices[0].agent if notices else None
        return s != agent and _dropping(s, "volunteer")(s, r, topic, payload)

    h.bus.drop_filter = drop_non_agent_volunteers
    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id).start()
    agent = h.messages("key_epoch_start")[0].agent
    victim = next(d for d in h.ids if d != agent)
    (before,) = [v for v in h.messages("volunteer") if v.sender == victim]

    h.clients[victim].transport.kill()  # type: ignore[union-attr]
    h.bus.drop_filter = None
    restarted = h.client(victim)
    restarted.start()

    after = [v for v in h.messages("volunteer") if v.sender == victim][-1]
    assert (after.message_id, after.draws) == (before.message_id, before.draws)
    assert restarted.epoch == 1 and restarted.has_registry
    relayed = [
        b for b in h.messages("sealed_secret_key", victim) if b.recipient == victim
    ]
    assert len(relayed) == 1  # relayed once; the restarted device read it from disk
    h.clock.now += 10
    h.coordinator.tick()
    assert h.coordinator.is_done


def test_a_registry_that_is_not_one_hot_is_left_out_of_the_sum(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(4, rounds=1)
    cheat = "d0"
    h.bus.drop_filter = _dropping(cheat, "registration")
    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id).start()
    announce = h.messages("agent_public_key")[0]  # up, then relayed
    public_key = PaillierPublicKey.from_bytes(announce.public_key)
    two_ones = [1, 1] + [0] * 54  # a malformed registry: two categories
    max_parties = h.messages("key_epoch_start")[0].max_parties
    vector = encrypt_vector(public_key, PackingLayout(1, max_parties, 512), two_ones)
    caplog.set_level(logging.INFO)
    h.bus.drop_filter = None

    forged = Registration(
        federation=FED,
        run=h.coordinator.run_id,  # the run is no secret
        round=0,
        sender=cheat,
        epoch=1,
        registry=vector.to_bytes(public_key),
    )
    h.raw.publish(up_topic(FED, cheat, "control"), encode(forged))

    # the agent's check (before the sum is published) finds it; it adds up,
    # so the devices' own check of the total would not
    assert "1 of 4 registrations on page 0 are not one-hot" in caplog.text
    (registry_sum,) = h.messages("registry_sum")
    assert registry_sum.num_parties == 3
    assert all(c.has_registry for d, c in h.clients.items() if d != cheat)


class _NeedsClimb(NoTraining):
    def methods(self) -> tuple[str, ...]:
        return ("climb",)


def test_a_device_without_the_federations_methods_refuses_the_epoch(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(2, plugin=_NeedsClimb(), methods=(DubheSpec(), ClimbSpec()))
    caplog.set_level(logging.INFO)
    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id).start()  # selection-only: no CLIMB trainer

    assert h.messages("key_epoch_start")[0].methods == ("dubhe", "climb")
    refusals = [m for m in h.messages("error") if m.code == "method_mismatch"]
    assert {m.sender for m in refusals} == {"d0", "d1"}
    expected = "federation runs dubhe, climb; device is configured for dubhe"
    assert refusals[0].reason == expected
    assert f"d0 sits out: method_mismatch: {expected}" in caplog.text
    assert all(c.epoch is None for c in h.clients.values())
    assert h.messages("registration") == []


class _SignsASpec(NoTraining):
    """Selection rounds, with a model spec signed into each key epoch."""

    def model_spec(self) -> ModelSpec:
        return ModelSpec.of("classifier", (("w", (3, 4), "float"),))

    def methods(self) -> tuple[str, ...]:
        return ("fedavg",)


def test_a_device_whose_model_does_not_fit_the_signed_spec_sits_out_unregistered(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(3, plugin=_SignsASpec(), methods=(DubheSpec(), FedAvgSpec()))
    caplog.set_level(logging.INFO)
    h.coordinator.start()
    for device_id in h.ids:
        shape = (5, 4) if device_id == "d0" else (3, 4)
        h.client(device_id, trainer=ShapedTrainer(shape)).start()

    (notice,) = h.messages("key_epoch_start")
    assert notice.model_spec == _SignsASpec().model_spec()
    (refusal,) = h.messages("error")
    assert (refusal.sender, refusal.code) == ("d0", "model_mismatch")
    assert refusal.reason.startswith(
        "the federation's model classifier does not fit this device's model: "
        "tensor 'w': shape (5, 4) in this device's model, (3, 4) in the "
        "federation's model"
    )
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(
        line.startswith("d0: sitting out key epoch 1: model_mismatch: ")
        and "\n" not in line
        for line in lines
    )
    assert h.clients["d0"].sits_out
    assert not h.clients["d1"].sits_out and not h.clients["d2"].sits_out
    assert {m.sender for m in h.messages("registration")} == {"d1", "d2"}


def test_a_wrong_coordinator_pin_stops_the_device(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(2)
    h.coordinator.start()
    caplog.set_level(logging.INFO)
    client = h.client("d0", coordinator_fingerprint="0" * 32)
    client.start()

    assert not client.enrolled.is_set()
    assert "is not the configured pin" in caplog.text
    assert client.epoch is None


def test_a_refusal_of_the_coordinator_is_signed_and_names_the_acceptance(
    harness: Any,
) -> None:
    h = harness(2)
    h.coordinator.start()
    client = h.client("d0", coordinator_fingerprint="0" * 32)
    client.start()

    (acceptance,) = h.messages("enrol_result", "d0")
    (refusal,) = [m for m in h.messages("error") if m.sender == "d0"]
    assert refusal.code == "coordinator_identity_mismatch"
    assert refusal.in_reply_to == acceptance.message_id
    assert refusal.in_reply_to_digest == message_digest(acceptance)
    identity = h.coordinator.device_identity("d0")
    assert identity is not None
    verify_signature(identity, signing_bytes(refusal), refusal.signature)
    assert "d0" not in h.coordinator.online_devices()  # the coordinator counted it


def test_forged_notices_are_dropped(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(3, rounds=1)
    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id).start()
    assert h.coordinator.is_done
    caplog.set_level(logging.INFO)
    forger = DeviceIdentity.generate("coordinator")
    fake = SelectionResult(
        federation=FED,
        run=h.coordinator.run_id,  # the run is no secret: the signature counts
        round=9,
        sender="coordinator",
        selected=("d1",),
    )
    fake = fake.model_copy(update={"signature": forger.sign(b"anything")})
    by_device = RoundAnnounce(
        federation=FED,
        run=h.coordinator.run_id,
        round=9,
        sender="d2",
        epoch=1,
        k=1,
        deadline_s=1,
    )

    h.raw.publish(global_topic(FED, name_for("selection_result")), encode(fake))
    h.raw.publish(global_topic(FED, "round"), encode(by_device))

    assert 9 not in h.clients["d1"].stats.selected_rounds
    assert "refused selection_result: bad_signature" in caplog.text
    assert "dropped round_announce claiming sender d2" in caplog.text


def test_the_agent_keys_come_signed_in_the_epoch_notice(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(3, rounds=1)
    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id).start()
    assert h.coordinator.is_done
    (notice,) = h.messages("key_epoch_start")
    assert h.messages("hello", notice.agent) == []  # nothing relayed
    agent = h.clients[notice.agent].link.identity.public()
    assert all(c.epoch_view.agent == agent for c in h.clients.values())
    caplog.set_level(logging.INFO)
    impostor = DeviceIdentity.generate(notice.agent).public()
    keys = notice.agent_keys.model_copy(
        update={
            "x25519_public": impostor.x25519_public,
            "ed25519_public": impostor.ed25519_public,
        }
    )
    swapped = notice.model_copy(update={"agent_keys": keys, "message_id": "swap"})

    h.raw.publish(global_topic(FED, name_for("key_epoch_start")), encode(swapped))

    assert "refused key_epoch_start: bad_signature" in caplog.text
    assert all(c.epoch_view.agent == agent for c in h.clients.values())


def _enrol_result(
    identity: DeviceIdentity, *, run: str = "", signer: Any = None
) -> bytes:
    """An acceptance for d0 carrying `identity`, signed by `signer` (default: it)."""
    public = identity.public()
    keys = IdentityKeys(
        device_id=COORDINATOR,
        x25519_public=public.x25519_public,
        ed25519_public=public.ed25519_public,
    )
    result = EnrolResult(
        federation=FED,
        run=run,
        round=0,
        sender=COORDINATOR,
        device_id="d0",
        accepted=True,
        coordinator_keys=keys,
    )
    signature = (signer or identity).sign(signing_bytes(result))
    return encode(result.model_copy(update={"signature": signature}))


def test_enrolment_pins_the_coordinator_keys_of_the_result(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(2)  # the coordinator is not started: the test plays it
    client = h.client("d0")
    client.start()
    coordinator = DeviceIdentity.generate(COORDINATOR)
    topic = down_topic(FED, "d0", name_for("enrol_result"))

    h.raw.publish(topic, _enrol_result(coordinator))
    assert client.enrolled.is_set()
    assert client.link.store.load_coordinator() == coordinator.public()
    caplog.set_level(logging.INFO)
    h.raw.publish(topic, _enrol_result(DeviceIdentity.generate(COORDINATOR)))
    assert "is not the pinned" in caplog.text
    assert client.link.store.load_coordinator() == coordinator.public()


def test_only_a_signed_acceptance_of_the_pinned_coordinator_moves_a_device_to_a_run(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(2)
    client = h.client("d0")
    client.start()
    coordinator = DeviceIdentity.generate(COORDINATOR)
    topic = down_topic(FED, "d0", name_for("enrol_result"))
    h.raw.publish(topic, _enrol_result(coordinator, run="run1"))
    assert client.link.store.load_run().run == "run1"
    caplog.set_level(logging.WARNING)

    forger = DeviceIdentity.generate(COORDINATOR)
    h.raw.publish(topic, _enrol_result(coordinator, run="run2", signer=forger))
    assert client.link.store.load_run().run == "run1"  # the signature does not verify
    assert "refused enrol_result" in caplog.text

    h.raw.publish(topic, _enrol_result(coordinator, run="run2"))  # a reset
    assert client.link.store.load_run().run == "run2"
    assert client.link.store.load_run().left == ("run1",)
    assert "the coordinator started a new run run2" in caplog.text

    h.raw.publish(topic, _enrol_result(coordinator, run="run1"))  # a replay
    assert client.link.store.load_run().run == "run2"
    assert "run run1 is over" in caplog.text


def _federation_end(identity: DeviceIdentity, run: str, rounds: int) -> bytes:
    """The signed end of ``run`` after ``rounds`` rounds (no model: selection only)."""
    end = FederationEnd(
        federation=FED, run=run, round=rounds, sender=COORDINATOR, rounds=rounds
    )
    return encode(
        end.model_copy(update={"signature": identity.sign(signing_bytes(end))})
    )


def test_a_device_kept_running_finishes_each_run_and_an_old_end_ends_nothing(
    harness: Any,
) -> None:
    h = harness(2)  # the coordinator is not started: the test plays it
    client = h.client("d0")
    client.start()
    coordinator = DeviceIdentity.generate(COORDINATOR)
    enrol = down_topic(FED, "d0", name_for("enrol_result"))
    end = global_topic(FED, name_for("federation_end"))
    h.raw.publish(enrol, _enrol_result(coordinator, run="run1"))
    old_end = _federation_end(coordinator, "run1", 3)
    h.raw.publish(end, old_end)
    assert client.finished.is_set()

    h.raw.publish(enrol, _enrol_result(coordinator, run="run2"))  # new-run
    assert not client.finished.is_set()
    h.raw.publish(end, old_end)  # replayed, or still retained on the broker
    assert not client.finished.is_set()
    h.raw.publish(end, _federation_end(coordinator, "run2", 5))
    assert client.finished.is_set()


def test_selected_devices_train_once_per_round() -> None:
    trainer = NoOpTrainer(17)
    report = trainer.train(3)
    assert (report.round, report.num_examples) == (3, 17)
    assert trainer.rounds == [3]
    with pytest.raises(ValueError):
        NoOpTrainer(-1)


def test_device_config_from_toml_and_env(tmp_path: Path) -> None:
    path = tmp_path / "device.toml"
    path.write_text(
        'device_id = "dev7"\nfederation = "trial"\nstate_dir = "/tmp/x"\n'
        '[broker]\nurl = "mqtts://broker:8883"\nusername = "dev7"\n'
    )
    config = load_device_config(
        path, {"URSA_BROKER__PASSWORD": "pw", "URSA_OBFUSCATOR_POOL_SIZE": "8"}
    )
    assert config.obfuscator_pool_size == 8
    mqtt = config.broker.mqtt_config("dev7", will=("t/x", b"off"))
    assert (mqtt.host, mqtt.port, mqtt.tls, mqtt.will_retain) == (
        "broker",
        8883,
        True,
        True,
    )
    with pytest.raises(ValueError, match="username must equal device_id"):
        DeviceConfig(
            device_id="a", federation="f", state_dir=tmp_path, broker={"username": "b"}
        )


def test_labels_must_be_class_indices(tmp_path: Path) -> None:
    config = DeviceConfig(device_id="a", federation="f", state_dir=tmp_path)
    with pytest.raises(ValueError, match="1-D array of class indices"):
        EdgeClient(config, np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="non-negative"):
        EdgeClient(config, [1, -2])


def test_an_undecodable_stored_epoch_is_ignored_at_start(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from ursa.edge_sdk.state_dir import DeviceStateDir, StoredEpoch

    h = harness(4, rounds=1)
    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id).start()
    victim = h.ids[0]
    state_path = h.clients[victim].link.store.path
    h.clients[victim].transport.kill()  # type: ignore[union-attr]
    DeviceStateDir(state_path).save_epoch(StoredEpoch(notice=b"\x81\xa4kind\xa3bad"))

    with caplog.at_level(logging.WARNING, logger="ursa.edge_sdk"):
        restarted = h.client(victim)
        restarted.start()  # must not raise

    assert "ignoring the stored key epoch" in caplog.text
    assert restarted.enrolled.is_set()


def test_an_app_names_its_methods_and_its_trainer_must_agree(tmp_path: Path) -> None:
    def config(*kinds: str) -> DeviceConfig:
        return DeviceConfig.model_validate(
            {
                "device_id": "a",
                "federation": "f",
                "state_dir": tmp_path,
                "methods": [{"kind": kind} for kind in kinds],
            }
        )

    labels = np.array([0, 1, 1])
    assert EdgeClient(config("random"), labels).methods() == ("random",)
    with pytest.raises(ValueError, match="the trainer runs random"):
        EdgeClient(config("random", "climb"), labels, trainer=NoOpTrainer(3))


def test_the_dubhe_table_names_the_draw_the_device_runs(tmp_path: Path) -> None:
    def client(table: dict[str, str]) -> EdgeClient:
        config = DeviceConfig.model_validate(
            {"device_id": "a", "federation": "f", "state_dir": tmp_path,
             "methods": [table]}
        )  # fmt: skip
        return EdgeClient(config, np.array([0, 1, 1]))

    assert client({"kind": "dubhe"}).method(Dubhe).draw == "paper"
    stratified = client({"kind": "dubhe", "draw": "stratified"})
    assert stratified.method(Dubhe).draw == "stratified"
    with pytest.raises(ValidationError, match="'paper' or 'stratified'"):
        client({"kind": "dubhe", "draw": "coins"})


def test_a_climb_table_gives_an_app_trainer_the_dual_steps(tmp_path: Path) -> None:
    config = DeviceConfig.model_validate(
        {
            "device_id": "a",
            "federation": "f",
            "state_dir": tmp_path,
            "methods": [{"kind": "dubhe"}, {"kind": "climb", "eta_d": 0.25}],
        }
    )

    client = EdgeClient(config, np.array([0, 1, 1]), trainer=PlainTrainer())

    assert client.methods() == ("dubhe", "climb")
    assert client.method(Climb).config.eta_d == 0.25


class _Balances(DeviceMethod):
    """A balancing stand-in: its data replaces the device's, once."""

    name = "balances"

    def __init__(self, ctx: DeviceContext, labels: list[int]) -> None:
        self.ctx = ctx
        self.labels = np.array(labels, dtype=np.int64)
        self.asked = 0

    def register(self, router: Router) -> None:
        pass

    def replace_data(self) -> LocalData | None:
        self.asked += 1
        return LocalData(None, self.labels)


def test_a_method_replaces_the_data_before_the_first_registration(
    harness: Any,
) -> None:
    h = harness(4)
    made: list[_Balances] = []

    def balances(ctx: DeviceContext) -> _Balances:
        made.append(_Balances(ctx, [3, 3, 3, 4]))
        return made[-1]

    h.coordinator.start()
    for device_id in h.ids:
        h.client(device_id, methods=[balances] if device_id == "d0" else None).start()

    assert h.coordinator.is_done and h.clients["d0"].has_registry
    (built,) = made  # built once, over d0's own context
    assert built.asked == 1 and built.ctx.device_id == "d0"
    assert h.clients["d0"].data.labels.tolist() == [3, 3, 3, 4]
    trainer = h.clients["d0"].data.trainer
    assert isinstance(trainer, NoOpTrainer) and trainer.num_examples == 4
    assert h.clients["d0"].methods() == ("dubhe",)  # a helper of no [[methods]] role


def test_who_may_send_a_kind_besides_the_coordinator_is_read_off_its_class(
    tmp_path: Path,
) -> None:
    config = DeviceConfig(device_id="d0", federation=FED, state_dir=tmp_path)
    client = EdgeClient(config, [0, 1])
    hop = RingHop(
        federation=FED,
        round=0,
        sender="d1",
        ring_id="r",
        hop_index=0,
        recipient="d0",
        contributors=("d1",),
        box=b"sealed",
    )
    key = AgentPublicKey(federation=FED, round=0, sender="d1", epoch=1, public_key=b"k")
    announce = RoundAnnounce(
        federation=FED, round=1, sender="d1", epoch=1, k=2, deadline_s=5.0
    )

    def accepted(message: Any, *, own: bool) -> bool:
        name = name_for(message.kind)
        topic = down_topic(FED, "d0", name) if own else global_topic(FED, name)
        return client.admission.accept(topic, encode(message)) is not None

    assert accepted(hop, own=True) and not accepted(hop, own=False)  # a peer's
    assert accepted(key, own=False)  # the agent's, relayed (and signed)
    assert not accepted(announce, own=True)  # the coordinator's only


def test_a_device_drops_messages_over_its_admission_limits_before_decoding(
    harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness(3, rounds=1)
    h.coordinator.start()
    limits = AdmissionLimits(messages_per_s=1.0, burst=50)
    flooded = h.client("d0", admission=limits, max_message_bytes=4096)
    for device_id in h.ids:
        (flooded if device_id == "d0" else h.client(device_id)).start()
    assert h.coordinator.is_done
    before = flooded.admission_stats()
    caplog.set_level(logging.WARNING, logger="ursa.edge_sdk")
    topic = down_topic(FED, "d0", name_for("error"))
    notice = ErrorReply(
        federation=FED, round=1, sender=COORDINATOR, code="late", reason="x"
    )

    for _ in range(500):
        h.raw.publish(topic, encode(notice))
    h.raw.publish(topic, b"\x00" * 5000)

    stats = flooded.admission_stats()
    dropped = stats.total_dropped() - before.total_dropped()
    assert dropped >= 500 - limits.burst
    assert stats.dropped_by_sender["d0"][DropReason.RATE] >= 500 - limits.burst
    assert all(
        c.admission_stats().total_dropped() == 0
        for c in h.clients.values()
        if c is not flooded
    )
    lines = [r for r in caplog.records if "over the admission limits" in r.message]
    assert len(lines) == 1 and "d0: dropping messages on d0 topics" in lines[0].message


class _FlakyTransport(InMemoryTransport):
    """An in-memory transport whose connection the test can drop and restore."""

    down = False

    @property
    def is_connected(self) -> bool:
        return not self.down and super().is_connected


def test_a_device_says_online_again_after_a_lost_connection(tmp_path: Path) -> None:
    bus = InMemoryBus()
    cfg = DeviceConfig(
        device_id="d0", federation=FED, state_dir=tmp_path, obfuscator_pool_size=0
    )
    transport = _FlakyTransport(bus, "d0")
    client = EdgeClient(cfg, np.arange(10), transport=transport)
    client.start()
    status = f"ursa/v1/{FED}/dev/d0/status"
    bus.flush()
    assert decode(bus.retained[status]).online
    broker = InMemoryTransport(bus, "broker")
    broker.connect()
    broker.publish(status, device_will(cfg)[1], retain=True)  # a stopping broker
    bus.flush()

    client.poll()  # connected all along: nothing new
    assert not decode(bus.retained[status]).online
    transport.down = True
    client.poll()
    transport.down = False
    client.poll()  # back: online again
    bus.flush()

    assert decode(bus.retained[status]).online
    client.stop()


class _BouncingTransport(InMemoryTransport):
    """An in-memory transport that reconnects between two polls, unseen."""

    bounces = 0

    @property
    def connections(self) -> int:
        return super().connections + self.bounces


def test_a_reconnect_shorter_than_a_poll_still_says_online_again(
    tmp_path: Path,
) -> None:
    bus = InMemoryBus()
    cfg = DeviceConfig(
        device_id="d0", federation=FED, state_dir=tmp_path, obfuscator_pool_size=0
    )
    transport = _BouncingTransport(bus, "d0")
    client = EdgeClient(cfg, np.arange(10), transport=transport)
    client.start()
    status = f"ursa/v1/{FED}/dev/d0/status"
    broker = InMemoryTransport(bus, "broker")
    broker.connect()
    broker.publish(status, device_will(cfg)[1], retain=True)  # a stopping broker
    bus.flush()
    client.poll()
    assert not decode(bus.retained[status]).online  # no reconnect: nothing said

    transport.bounces += 1  # down and up again between two polls
    client.poll()
    bus.flush()

    assert decode(bus.retained[status]).online
    client.stop()


def test_a_device_says_hello_again_until_the_coordinator_answers(
    harness: Any,
) -> None:
    h = harness(2, rounds=1)
    lost: list[bytes] = []
    blocked = [True]

    def lose_enrol_results(s: str, r: str, topic: str, data: bytes) -> bool:
        if not blocked[0] or s != "coordinator" or r != "d0":
            return False
        try:
            kind = decode(data).kind
        except ProtocolError:
            return False
        if kind == "enrol_result":  # e.g. the coordinator died before it left
            lost.append(data)
            return True
        return False

    h.bus.drop_filter = lose_enrol_results
    h.coordinator.start()
    d0 = h.client("d0")
    d0.start()
    h.client("d1").start()
    assert lost and not d0.enrolled.is_set()
    assert not h.coordinator.is_done  # its key epoch waits for d0

    def hellos_after(now: float) -> int:
        d0.enrolment.retry_hello(now)
        d0._connection.flush()
        h.bus.flush()
        return sum(1 for m in h.messages("hello") if m.sender == "d0")

    first = hellos_after(0.0)  # the first retry is scheduled, not sent
    assert hellos_after(9.9) == first
    blocked[0] = False
    assert hellos_after(10.0) == first + 1

    assert d0.enrolled.is_set()
    assert hellos_after(1000.0) == first + 1  # answered: no more hellos
    assert h.coordinator.is_done  # d0 took its part in the epoch and round
