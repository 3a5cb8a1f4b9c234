"""The coordinator service over the in-memory bus: flow, admission, dedup, restart."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from ursa.coordinator.config import BrokerConfig, EnrolmentConfig
from ursa.coordinator.methods.dubhe import DubheSelection, DubheStep
from ursa.coordinator.methods.dubhe.migration import VERSION as DUBHE_SCHEMA
from ursa.coordinator.methods.dubhe.records import DubheRecords
from ursa.coordinator.round_state import Stage
from ursa.coordinator.service import MAX_HELD
from ursa.coordinator.store import DB_FILENAME
from ursa.crypto.identity import (
    DeviceIdentity,
    DevicePublicIdentity,
    verify_signature,
)
from ursa.edge_sdk.state_dir import DeviceStateDir
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.messages import (
    AgentAnswer,
    Hello,
    Registration,
    RoundAnnounce,
    Status,
    Volunteer,
)
from ursa.protocol.topics import status_topic, up_topic

from .methods.dubhe.test_migration import write_as_before

FED = "fed"


def _kind_of(payload: bytes) -> str:
    try:
        return decode(payload).kind  # type: ignore[no-any-return]
    except Exception:
        return "?"


def _drop(sender: str | None, kind: str) -> Any:
    """A bus drop filter losing `kind` messages from `sender` (any if None)."""

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        return r == "coordinator" and sender in (None, s) and _kind_of(payload) == kind

    return drop


def _hold_volunteers() -> Any:
    """A drop filter losing the devices' own volunteers (not a test's, sent raw).

    Silence means no: with no volunteer, the window stays open until its end.
    """

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        return r == "coordinator" and s != "raw" and _kind_of(payload) == "volunteer"

    return drop


def _assert_rounds_exactly_k(fed: Any, rounds: int) -> None:
    results = fed.messages("selection_result")
    by_round: dict[int, set[str]] = {}
    for _, result in results:
        verify_signature(
            fed.coordinator.identity, signing_bytes(result), result.signature
        )
        assert len(result.selected) == fed.config.k
        by_round.setdefault(result.round, set()).add(result.message_id)
    assert sorted(by_round) == list(range(1, rounds + 1))
    assert all(len(ids) == 1 for ids in by_round.values()), "a round selected twice"
    assert fed.coordinator.store.completed_rounds() == rounds


def test_full_flow_selects_exactly_k_in_every_round(federation: Any) -> None:
    fed = federation(num_devices=10, k=3, tries=3, rounds=4)

    fed.start()

    assert fed.coordinator.is_done
    _assert_rounds_exactly_k(fed, 4)
    assert all(d.has_registry and d.epoch == 1 for d in fed.devices.values())
    ((_, registry_sum),) = fed.messages("registry_sum")
    assert registry_sum.num_parties == 10
    for _, result in fed.messages("selection_result"):
        for device_id in result.selected:
            assert result.round in fed.devices[device_id].stats.selected_rounds
    assert len(fed.messages("agent_answer")) == 4


def test_single_try_rounds_skip_distributions(federation: Any) -> None:
    fed = federation(num_devices=6, k=2, tries=1, rounds=2)

    fed.start()

    _assert_rounds_exactly_k(fed, 2)
    assert fed.messages("try_assignment") == []
    assert fed.messages("encrypted_distribution") == []


def test_waits_for_min_devices_then_keys_an_epoch(federation: Any) -> None:
    fed = federation(num_devices=5, k=2, rounds=1)
    fed.coordinator.start()
    for device_id in fed.device_ids[:4]:
        fed.new_device(device_id).start()
    assert fed.coordinator.state.stage is Stage.ENROLMENT

    fed.new_device(fed.device_ids[4]).start()

    ((_, notice),) = fed.messages("key_epoch_start")
    verify_signature(fed.coordinator.identity, signing_bytes(notice), notice.signature)
    assert notice.agent in fed.device_ids
    enrolled = DevicePublicIdentity.from_bytes(
        fed.coordinator.store.enrolled()[notice.agent]
    )
    keys = notice.agent_keys
    assert (keys.device_id, keys.x25519_public, keys.ed25519_public) == (
        notice.agent,
        enrolled.x25519_public,
        enrolled.ed25519_public,
    )
    hellos = [topic for topic, _ in fed.messages("hello")]
    assert hellos and all("/up/" in topic for topic in hellos)  # none relayed
    assert fed.coordinator.is_done


def test_start_logs_one_summary_line_without_the_broker_password(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    broker = BrokerConfig(url="mqtt://coordinator:hunter2@127.0.0.1:1883")
    fed = federation(num_devices=4, k=2, tries=2, rounds=5, broker=broker)
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    fed.coordinator.start()
    lines = [
        r.message for r in caplog.records if "coordinator: federation" in r.message
    ]
    assert lines == [
        f"coordinator: federation {FED}, run {fed.coordinator.run_id}, methods "
        "dubhe, broker mqtt://127.0.0.1:1883, K=2 of 4 devices, 2 tries, 5 rounds, "
        f"state {fed.config.state_dir} (a new run)"
    ]
    assert "hunter2" not in caplog.text


def test_expected_races_are_info_and_real_refusals_warnings(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=4, k=2, rounds=2)
    fed.coordinator.start()
    for device_id in fed.device_ids[:3]:
        fed.new_device(device_id).start()
    d0 = fed.device_ids[0]
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    status = Status(federation=FED, round=0, sender="d03", online=True, state="idle")
    fed.raw.publish(status_topic(FED, "d03"), encode(status))  # before its hello
    old = Volunteer(federation=FED, round=1, sender=d0, draws=(True,), run="old")
    fed.send_as(d0, old)  # a rejoining device's message of a run gone by
    fed.raw.publish(f"ursa/v1/{FED}/dev/{d0}/up/control", b"\xc1not msgpack")

    def level(needle: str) -> str:
        (record,) = [r for r in caplog.records if needle in r.getMessage()]
        return record.levelname

    assert level("rejected status from d03: unknown_device") == "INFO"
    assert level(f"rejected volunteer from {d0}: wrong_run") == "INFO"
    assert level(f"rejected message from {d0}: malformed") == "WARNING"


def test_bad_messages_are_rejected_with_reasons_and_the_run_continues(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=4, k=2, rounds=2, max_message_bytes=4096)
    fed.coordinator.start()
    for device_id in fed.device_ids[:3]:
        fed.new_device(device_id).start()
    d0, d1 = fed.device_ids[:2]
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    fed.raw.publish(f"ursa/v1/{FED}/dev/{d0}/up/control", b"\xc1not msgpack")
    fed.raw.publish(f"ursa/v1/{FED}/dev/{d0}/up/control", b"\x00" * 5000)
    fed.send_as("zz", Volunteer(federation=FED, round=1, sender="zz", draws=(True,)))
    fed.send_as(d0, Volunteer(federation=FED, round=1, sender=d1, draws=(True,)))
    fed.send_as(
        d0,
        RoundAnnounce(federation=FED, round=1, sender=d0, epoch=1, k=2, deadline_s=1),
    )
    fed.raw.publish(f"ursa/v1/{FED}/dev/{d0}/up/control/extra", b"x")

    errors = {e.code for e in fed.errors_to(d0)}
    assert {"malformed", "oversize", "unauthorised"} <= errors
    assert [e.code for e in fed.errors_to("zz")] == ["unknown_device"]
    text = caplog.text
    assert "rejected message from d00: malformed: malformed msgpack" in text
    assert "oversize: message of 5000 bytes exceeds the limit" in text
    assert "rejected volunteer from zz: unknown_device: device is not enrolled" in text
    assert "sender 'd01' does not match the topic's device" in text
    assert "a device may not send round_announce" in text
    assert "invalid topic" in text

    fed.new_device(fed.device_ids[3]).start()
    assert fed.coordinator.is_done
    _assert_rounds_exactly_k(fed, 2)


def test_wrong_round_wrong_epoch_and_non_agent_answers_are_rejected(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=5, k=2, tries=2, rounds=1)
    last = fed.device_ids[-1]
    fed.bus.drop_filter = _hold_volunteers()
    fed.start(settle=False)
    assert _dubhe_step(fed) is DubheStep.VOLUNTEERING
    agent = fed.messages("key_epoch_start")[0][1].agent
    other = next(d for d in fed.device_ids if d not in (agent, last))
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    fed.send_as(other, Volunteer(federation=FED, round=7, sender=other, draws=(1, 1)))
    fed.send_as(other, Volunteer(federation=FED, round=0, sender=other, draws=(1, 1)))
    fed.send_as(
        other,
        Registration(federation=FED, round=1, sender=other, epoch=9, registry=b"x"),
    )
    fed.send_as(other, AgentAnswer(federation=FED, round=1, sender=other, best_try=0))

    codes = [e.code for e in fed.errors_to(other)]
    assert codes == ["wrong_round", "late", "wrong_epoch", "late"]
    assert "round 7 is not open (current 1)" in caplog.text
    assert "key epoch 9 is not current (1)" in caplog.text
    assert "round 1 is past agent (volunteering)" in caplog.text

    fed.bus.drop_filter = None
    fed.tick(11)  # the window ends: the top-up fills the tries; the round goes on
    fed.settle()
    assert fed.coordinator.is_done
    _assert_rounds_exactly_k(fed, 1)


def test_bad_ciphertexts_are_rejected_and_not_summed(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=4, k=2, rounds=1)
    cheat = fed.device_ids[0]
    fed.bus.drop_filter = _drop(cheat, "registration")
    fed.start()
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    real = next(m for _, m in fed.messages("registration") if m.sender == cheat)

    truncated = real.registry[:-3]
    fed.send_as(
        cheat, real.model_copy(update={"registry": truncated, "message_id": "b1"})
    )
    widened = bytearray(real.registry)
    widened[15:19] = (2).to_bytes(4, "big")  # header claims two parties
    fed.send_as(
        cheat, real.model_copy(update={"registry": bytes(widened), "message_id": "b2"})
    )

    assert [e.code for e in fed.errors_to(cheat)] == ["bad_ciphertext"] * 2
    assert "claims 2 parties, expected 1" in caplog.text
    assert fed.coordinator.state.stage is Stage.REGISTRATION  # not counted
    fed.bus.drop_filter = None
    fed.send_as(cheat, real)
    assert fed.coordinator.is_done
    assert fed.messages("registry_sum")[0][1].num_parties == 4


def test_duplicates_are_ignored_not_double_counted(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=4, k=2, tries=2, rounds=1)
    fed.bus.drop_filter = _hold_volunteers()
    fed.start(settle=False)
    caplog.set_level(logging.DEBUG, logger="ursa.coordinator")
    topic, payload = next(
        (t, p) for t, p in fed.captured if "/up/" in t and _kind_of(p) == "volunteer"
    )
    volunteer = decode(payload)
    first = volunteer.sender
    fed.bus.drop_filter = None

    fed.raw.publish(topic, payload)  # the volunteer the coordinator did not get
    fed.raw.publish(topic, payload)  # same message id: a broker redelivery
    fed.send_as(first, volunteer.model_copy(update={"message_id": "fresh1"}))

    stored = DubheRecords(fed.coordinator.store).round(1)
    assert list(stored.volunteers) == [first]
    assert f"duplicate volunteer {volunteer.message_id} from {first}" in caplog.text
    # another id, the same (round, device): its stored record makes it a duplicate
    assert f"duplicate volunteer fresh1 from {first}" in caplog.text
    assert fed.errors_to(first) == []


def test_silent_agent_falls_back_and_rekeys_before_the_next_round(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=6, k=2, tries=3, rounds=2)
    fed.bus.drop_filter = _drop(None, "agent_answer")
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    fed.start()
    assert _dubhe_step(fed) is DubheStep.AGENT
    first_agent = fed.messages("key_epoch_start")[0][1].agent
    fed.bus.drop_filter = _drop(first_agent, "agent_answer")

    fed.tick(11)
    fed.settle()

    assert "agent silent past the deadline; fallback to try 0" in caplog.text
    notices = [m for _, m in fed.messages("key_epoch_start")]
    assert [n.epoch for n in notices] == [1, 2]
    assert notices[1].agent != first_agent
    assert fed.coordinator.is_done
    _assert_rounds_exactly_k(fed, 2)
    results = {m.round: m for _, m in fed.messages("selection_result")}
    assert results[1].try_index == 0


def test_agent_offline_at_round_start_triggers_a_new_epoch(federation: Any) -> None:
    fed = federation(num_devices=6, k=2, tries=2, rounds=1, quorum=5)
    fed.bus.drop_filter = _drop(None, "registration")
    fed.start()
    agent = fed.messages("key_epoch_start")[0][1].agent
    fed.transports[agent].kill()  # last will: offline
    fed.bus.drop_filter = None
    fed.tick(11)  # registration deadline: nobody registered -> new epoch

    notices = [m for _, m in fed.messages("key_epoch_start")]
    assert len(notices) >= 2 and notices[-1].agent != agent
    assert fed.coordinator.is_done
    _assert_rounds_exactly_k(fed, 1)
    assert agent not in fed.messages("selection_result")[0][1].selected


@pytest.mark.parametrize("old_form", [False, True], ids=["store", "old_form"])
@pytest.mark.parametrize(
    "stall", ["volunteer", "encrypted_distribution", "agent_answer"]
)
def test_restart_from_sqlite_mid_round_resumes_without_double_counting(
    federation: Any, stall: str, old_form: bool
) -> None:
    """``old_form``: the store is rewritten as the version before wrote it
    (Dubhe's rows in core tables); the restart moves them once and resumes."""
    fed = federation(num_devices=6, k=2, tries=3, rounds=3)
    fed.bus.drop_filter = _drop(None, stall)  # round 1 stalls at that stage
    fed.start(settle=stall != "volunteer")
    expected = {
        "volunteer": DubheStep.VOLUNTEERING,
        "encrypted_distribution": DubheStep.DISTRIBUTIONS,
        "agent_answer": DubheStep.AGENT,
    }
    assert _dubhe_step(fed) is expected[stall]
    assert fed.coordinator.state.round == 1
    enrolled_before = fed.coordinator.store.enrolled()
    round_before = fed.coordinator.state.round

    kept = DubheRecords(fed.coordinator.store).round(1)
    fed.coordinator_transport.kill()  # kill -9: no clean shutdown
    fed.coordinator.store.close()
    if old_form:
        write_as_before(fed.config.state_dir / DB_FILENAME)
    fed.bus.drop_filter = None
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    assert fed.coordinator.store.get_meta("schema.dubhe") == str(DUBHE_SCHEMA)
    resumed = DubheRecords(fed.coordinator.store).round(1)  # the bus runs on inline
    assert bool(kept.volunteers) is (stall != "volunteer")
    assert kept.volunteers.items() <= resumed.volunteers.items()
    assert kept.distributions.items() <= resumed.distributions.items()
    assert kept.tries is None or resumed.tries == kept.tries
    fed.settle()

    assert fed.coordinator.store.enrolled() == enrolled_before
    assert len(fed.messages("enrol_result")) == 6  # nobody re-enrolled
    assert [m.epoch for _, m in fed.messages("key_epoch_start")][-1] == 1
    assert fed.coordinator.state.round >= round_before
    assert fed.coordinator.is_done
    _assert_rounds_exactly_k(fed, 3)
    ids = Counter(m.message_id for _, m in fed.messages("selection_result"))
    assert len(ids) == 3


def test_pinned_mode_refuses_unlisted_and_wrong_keys(
    federation: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pins = {}
    for device_id in ("d00", "d01", "d02"):
        identity = DeviceIdentity.load_or_create(tmp_path / device_id, device_id)
        pins[device_id] = identity.public().fingerprint()
    d02 = pins["d02"]
    pins["d02"] = "0" * 32
    fed = federation(
        num_devices=3,
        k=1,
        rounds=1,
        enrolment=EnrolmentConfig(mode="pinned", pins=pins),
    )
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    fed.device_ids.append("d03")
    fed.start()

    results = {m.device_id: m for _, m in fed.messages("enrol_result")}
    assert results["d00"].accepted and results["d01"].accepted
    assert not results["d02"].accepted and not results["d03"].accepted
    assert (
        f"refused enrolment of d02 (fingerprint {d02}): identity fingerprint does "
        "not match pin; to admit it: ursa coordinator enrol --config <coordinator "
        f"config> --device d02 --fingerprint {d02}"
    ) in caplog.text
    assert "refused enrolment of d03 (fingerprint " in caplog.text
    assert "device id is not on the enrolment list; to admit it: " in caplog.text
    assert fed.coordinator.state.stage is Stage.ENROLMENT  # 2 < min_devices=3


def test_tofu_refuses_a_changed_key(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=2, k=1, rounds=1)
    fed.start()
    impostor = DeviceIdentity.generate("d00").public()
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    fed.send_as(
        "d00",
        Hello(
            federation=FED,
            round=0,
            sender="d00",
            device_id="d00",
            x25519_public=impostor.x25519_public,
            ed25519_public=impostor.ed25519_public,
        ),
    )

    last = fed.messages("enrol_result")[-1][1]
    assert not last.accepted
    assert "identity keys differ from the enrolled ones" in caplog.text
    assert fed.coordinator.store.enrolled()["d00"] != impostor.to_bytes()


def _dubhe_step(fed: Any) -> DubheStep | None:
    """Dubhe's step in the open round (the runtime's stage is SELECTING)."""
    assert fed.coordinator.state.stage is Stage.SELECTING
    method = fed.coordinator.selection
    assert isinstance(method, DubheSelection)
    return method.step


def test_reannouncements_are_rate_limited_whatever_the_method_asks(
    federation: Any,
) -> None:
    fed = federation(num_devices=5, k=2, tries=2, rounds=1)
    fed.bus.drop_filter = _hold_volunteers()
    fed.start(settle=False)
    assert _dubhe_step(fed) is DubheStep.VOLUNTEERING
    before = len(fed.messages("round_announce"))
    fed.coordinator.reannounce()  # right after the round's own announce
    fed.tick(0)
    assert len(fed.messages("round_announce")) == before

    fed.tick(1.0)
    for _ in range(5):
        fed.coordinator.reannounce()
    fed.tick(0)
    assert len(fed.messages("round_announce")) == before + 1
    fed.tick(1.0)
    fed.coordinator.reannounce()
    fed.tick(0)
    assert len(fed.messages("round_announce")) == before + 2


def test_a_message_queued_during_a_restart_waits_until_the_round_is_reopened(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=5, k=2, tries=2, rounds=1)
    late = fed.device_ids[-1]
    fed.bus.drop_filter = _hold_volunteers()
    fed.start(settle=False)
    assert _dubhe_step(fed) is DubheStep.VOLUNTEERING
    fed.coordinator_transport.kill()  # kill -9
    fed.coordinator.store.close()
    fed.bus.drop_filter = None
    queued = Volunteer(federation=FED, round=1, sender=late, draws=(1, 1))
    fed.send_as(late, queued)  # waits in the coordinator's broker session
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()  # the broker delivers it during connect()
    fed.settle()

    refused = [e.in_reply_to for e in fed.errors_to(late)]
    assert queued.message_id not in refused
    assert "not open" not in caplog.text
    stored = DubheRecords(fed.coordinator.store).round(1)
    assert late in stored.volunteers
    assert fed.coordinator.is_done


def test_a_refusal_for_timing_is_not_remembered_so_a_resend_is_judged_afresh(
    federation: Any,
) -> None:
    fed = federation(num_devices=5, k=2, tries=2, rounds=1)
    late = fed.device_ids[-1]
    fed.bus.drop_filter = _hold_volunteers()
    fed.start(settle=False)
    early = Volunteer(federation=FED, round=2, sender=late, draws=(1, 1))
    fed.send_as(late, early)
    assert [e.code for e in fed.errors_to(late)] == ["wrong_round"]
    assert not fed.coordinator.store.is_seen(early.message_id)

    garbled = Volunteer(federation=FED, round=1, sender=late, draws=(1,))
    fed.send_as(late, garbled)
    assert [e.code for e in fed.errors_to(late)][-1] == "malformed"
    assert fed.coordinator.store.is_seen(garbled.message_id)


def test_most_of_the_fleet_dropping_at_once_is_an_outage_not_a_departure(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=5, k=2, tries=2, rounds=1)
    fed.bus.drop_filter = _hold_volunteers()
    fed.start(settle=False)
    assert _dubhe_step(fed) is DubheStep.VOLUNTEERING
    caplog.set_level(logging.INFO, logger="ursa.coordinator")

    dropped = fed.device_ids[:3]
    for device in dropped:
        fed.transports[device].kill()  # their last wills arrive together

    assert "treating it as a broker outage" in caplog.text
    assert set(dropped) <= fed.coordinator.online_devices()
    fed.tick(29)
    assert set(dropped) <= fed.coordinator.online_devices()
    fed.tick(2)  # the grace is over and they did not come back
    assert not set(dropped) & fed.coordinator.online_devices()


def test_a_new_key_epoch_waits_for_min_devices_online(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=6, k=2, tries=2, rounds=1)
    fed.bus.drop_filter = _drop(None, "registration")
    fed.start()
    agent = fed.messages("key_epoch_start")[0][1].agent
    fed.transports[agent].kill()  # 5 of min_devices=6 online
    fed.bus.drop_filter = None
    caplog.set_level(logging.WARNING, logger="ursa.coordinator")

    fed.tick(11)  # registration deadline: nobody registered -> a new epoch is due
    assert "needs 6 devices online (quorum), 5 are; waiting" in caplog.text
    assert fed.coordinator.state.stage is Stage.ENROLMENT
    for _ in range(5):
        fed.tick(11)
    assert len(fed.messages("key_epoch_start")) == 1  # no epoch below the quorum

    fed.new_device(agent).start()  # back: the fleet is whole again
    assert len(fed.messages("key_epoch_start")) == 2
    assert fed.coordinator.is_done


def test_a_replaced_coordinator_is_refused_loudly_and_repinned_devices_rejoin(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=3, k=2, tries=1, rounds=1)
    fed.start()
    assert fed.coordinator.is_done
    fed.coordinator.stop()
    for client in fed.devices.values():
        client.stop()
    caplog.set_level(logging.INFO)

    # a coordinator reset: an empty state dir, so a new identity
    fed.config = fed.config.model_copy(update={"state_dir": fed.tmp_path / "new"})
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    for device in fed.device_ids:
        fed.new_device(device).start()

    for device in fed.device_ids:
        codes = {e.code for _, e in fed.messages("error") if e.sender == device}
        assert codes == {"coordinator_identity_mismatch"}
    device_errors = [
        r
        for r in caplog.records
        if r.name == "ursa.edge_sdk" and r.levelname == "ERROR"
    ]
    assert len(device_errors) == 3
    assert all("ursa device repin" in r.getMessage() for r in device_errors)
    assert "d00 refuses this coordinator" in caplog.text
    fed.tick(100)
    assert fed.coordinator.state.stage is Stage.ENROLMENT  # nobody counted
    assert len(fed.messages("key_epoch_start")) == 1  # the old run's only

    for device in fed.device_ids:  # `ursa device repin`, then start again
        fed.devices[device].stop()
        DeviceStateDir(fed.tmp_path / device).forget_coordinator()
        fed.new_device(device).start()
    fed.tick(1)
    assert fed.coordinator.is_done


def _reset_keeping_identity(fed: Any) -> str:
    """Kill the coordinator; start one on an empty store with the old identity key."""
    old_state = fed.config.state_dir
    fed.coordinator_transport.kill()  # kill -9
    fed.coordinator.store.close()
    fed.config = fed.config.model_copy(
        update={
            "state_dir": fed.tmp_path / "new",
            "identity_key": old_state / "identity.key",
        }
    )
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    run: str = fed.coordinator.run_id
    return run


def test_a_reset_coordinator_with_its_identity_key_starts_a_run_devices_join(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=3, k=2, tries=1, rounds=2)
    fed.start()
    assert fed.coordinator.is_done
    old_run = fed.coordinator.run_id
    identity = fed.coordinator.identity
    caplog.set_level(logging.INFO)

    new_run = _reset_keeping_identity(fed)  # the devices keep running

    assert new_run != old_run
    assert fed.coordinator.identity == identity
    fed.tick(1)
    assert fed.coordinator.is_done  # the new run's rounds, with everyone
    notices = [m for _, m in fed.messages("key_epoch_start") if m.run == new_run]
    assert [m.epoch for m in notices] == [1]
    assert not [e for _, e in fed.messages("error") if e.sender != "coordinator"]
    for device, client in fed.devices.items():
        assert client.epoch == 1
        assert DeviceStateDir(fed.tmp_path / device).load_run().run == new_run
        assert DeviceStateDir(fed.tmp_path / device).load_run().left == (old_run,)
    assert "the coordinator started a new run" in caplog.text


def test_devices_drop_messages_of_an_older_run(federation: Any) -> None:
    fed = federation(num_devices=3, k=2, tries=1, rounds=1)
    fed.start()
    old_run = fed.coordinator.run_id
    topic, old_notice = next(
        (t, p) for t, p in fed.captured if _kind_of(p) == "key_epoch_start"
    )
    new_run = _reset_keeping_identity(fed)
    fed.tick(1)
    assert fed.coordinator.is_done
    enrols = len(fed.messages("enrol_result"))

    fed.raw.publish(topic, old_notice)  # the old run's notice, signed and all

    for client in fed.devices.values():
        assert client.run_drops()[old_run] >= 1
        assert client.epoch == 1  # the new run's epoch 1, not the old one
    assert len(fed.messages("enrol_result")) == enrols  # a left run: no hello
    assert decode(old_notice).run == old_run != new_run


def test_a_device_message_of_another_run_is_refused_and_not_remembered(
    federation: Any,
) -> None:
    fed = federation(num_devices=5, k=2, tries=2, rounds=1)
    late = fed.device_ids[-1]
    fed.bus.drop_filter = _drop(late, "volunteer")
    fed.start()
    stale = Volunteer(federation=FED, run="old", round=1, sender=late, draws=(1, 1))

    fed.send_as(late, stale)

    errors = fed.errors_to(late)
    assert [e.code for e in errors] == ["wrong_run"]
    assert errors[-1].in_reply_to == stale.message_id
    assert not fed.coordinator.store.is_seen(stale.message_id)
    assert fed.coordinator.run_drops() == {late: 1}
    stored = DubheRecords(fed.coordinator.store).round(1)
    assert late not in stored.volunteers


def test_messages_held_before_the_stage_is_restored_are_capped(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=3, k=2, tries=1, rounds=1)
    topic = up_topic(FED, "intruder", "control")  # the flood costs its sender
    caplog.set_level(logging.WARNING, logger="ursa.coordinator")

    for _ in range(MAX_HELD + 3):  # a flood before start() restored anything
        fed.coordinator.handle(topic, b"")

    assert fed.coordinator.held_dropped == 3
    assert "1 messages (0 bytes) dropped while starting up" in caplog.text
    fed.start()  # the held ones are judged then (empty: ignored)
    assert fed.coordinator.is_done


def test_a_fleet_that_doubled_since_the_key_epoch_is_rekeyed_before_the_next_round(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(
        num_devices=8, min_devices=4, k=2, tries=1, rounds=2, rekey_on_churn=0.5
    )
    first, joiners = fed.device_ids[:4], fed.device_ids[4:]
    fed.device_ids = first
    fed.bus.drop_filter = _drop(None, "volunteer")  # hold round 1 open
    fed.start(settle=False)
    assert len(fed.messages("key_epoch_start")) == 1
    for device_id in joiners:  # four more join in the middle of the epoch
        fed.new_device(device_id).start()
    fed.bus.drop_filter = None
    caplog.set_level(logging.INFO, logger="ursa.coordinator")
    for _ in range(6):
        fed.tick(11)

    assert fed.coordinator.is_done
    notices = [m for _, m in fed.messages("key_epoch_start")]
    assert len(notices) == 2, "the doubled fleet needs a new key epoch"
    assert "the online fleet changed by 100% since the key epoch" in caplog.text
    registered = {m.sender for _, m in fed.messages("registration") if m.epoch == 2}
    assert set(joiners) <= registered
    _assert_rounds_exactly_k(fed, 2)


def test_churn_below_the_fraction_or_without_a_quorum_keeps_the_epoch(
    federation: Any,
) -> None:
    fed = federation(
        num_devices=6, k=2, tries=1, rounds=2, quorum=5, rekey_on_churn=0.5
    )
    fed.bus.drop_filter = _drop(None, "volunteer")  # hold round 1 open
    fed.start(settle=False)
    agent = fed.messages("key_epoch_start")[0][1].agent
    gone = [d for d in fed.device_ids if d != agent][:2]
    for device_id in gone:  # 2 of 6 left for good: 33% < 50%
        fed.transports[device_id].kill()
    fed.bus.drop_filter = None
    for _ in range(6):
        fed.tick(11)
    assert fed.coordinator.is_done
    assert len(fed.messages("key_epoch_start")) == 1


def test_start_makes_a_loose_state_directory_private(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=2, k=1, rounds=1)
    state = fed.config.state_dir
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)
    with caplog.at_level(logging.WARNING):
        fed.coordinator.start()
    assert state.stat().st_mode & 0o777 == 0o700
    assert "coordinator state directory" in caplog.text
    device_dir = fed.device_config(fed.device_ids[0]).state_dir
    device_dir.mkdir(parents=True)
    device_dir.chmod(0o750)
    DeviceStateDir(device_dir)
    assert device_dir.stat().st_mode & 0o777 == 0o700


def test_a_devices_backlog_at_start_up_is_held_within_its_share(
    federation: Any,
) -> None:
    from ursa.coordinator.startup_hold import MAX_HELD_SENDER_BYTES

    fed = federation(num_devices=3, k=2, tries=1, rounds=1)
    flood = up_topic(FED, "intruder", "control")
    chunk = b"x" * (256 * 1024)
    for _ in range(2 * MAX_HELD_SENDER_BYTES // len(chunk)):
        fed.coordinator.handle(flood, chunk)
    fed.coordinator.handle(up_topic(FED, "d01", "control"), chunk)  # still held

    assert fed.coordinator.held_dropped == MAX_HELD_SENDER_BYTES // len(chunk)
    fed.start()
    assert fed.coordinator.is_done


def test_retained_messages_on_device_up_topics_are_cleared_not_admitted(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=3, k=2, tries=1, rounds=1)
    hostile = [up_topic(FED, "d01", "control"), f"{up_topic(FED, 'd01', 'x')}/deep"]
    for topic in hostile:
        fed.raw.publish(topic, b"r" * 1000, retain=True)
    caplog.set_level(logging.WARNING, logger="ursa.coordinator")

    fed.start()

    assert fed.coordinator.is_done  # d01 took part as usual
    assert fed.coordinator.retained_cleared == 2
    assert not set(hostile) & set(fed.bus.retained)
    assert caplog.text.count("cleared a retained message") == 1  # once per device
    fed.raw.publish(hostile[0], b"again", retain=True)
    fed.clock.advance(61.0)
    fed.coordinator.tick()  # the sweep subscribes again: cleared again
    assert fed.coordinator.retained_cleared == 3
    assert hostile[0] not in fed.bus.retained
