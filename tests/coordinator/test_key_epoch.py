"""The key epoch at any size: sealing in pages, restarts mid-paging, registration."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ursa.coordinator.config import DeadlinesConfig
from ursa.coordinator.round_state import Stage
from ursa.crypto.encoding import PackingLayout
from ursa.crypto.paillier import (
    decrypt_vector,
    encrypt_vector,
    generate_keypair,
    sum_encrypted,
)
from ursa.protocol.envelope import decode
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import SealedBox
from ursa.protocol.topics import bridge_state_topic


def _message(payload: bytes) -> Any:
    try:
        return decode(payload)
    except ProtocolError:
        return None


def _drop_boxes_of_pages(first: int) -> Any:
    """A drop filter losing the agent's boxes of pages `first` and later."""

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        message = _message(payload) if r == "coordinator" else None
        if message is None or message.kind != "sealed_keys":
            return False
        return bool(message.page >= first)

    return drop


def fed_deadlines(**overrides: float) -> DeadlinesConfig:
    """The federation fixture's deadlines (10 s each) with some changed."""
    names = ("key_epoch_s", "registration_s", "volunteer_s", "distributions_s")
    names += ("agent_s", "training_s")
    return DeadlinesConfig(**{**dict.fromkeys(names, 10.0), **overrides})


def _boxes_per_device(fed: Any) -> Counter[str]:
    return Counter(m.recipient for _, m in fed.messages("sealed_secret_key"))


def _agent(fed: Any) -> str:
    return str(fed.messages("key_epoch_start")[0][1].agent)


def test_the_key_is_sealed_page_by_page_and_each_device_gets_one_box(
    federation: Any,
) -> None:
    fed = federation(num_devices=9, k=2, tries=2, rounds=1, seal_page_size=2)
    fed.start()

    agent = _agent(fed)
    requests = [m for _, m in fed.messages("seal_request")]
    assert sorted(r.page for r in requests) == [0, 1, 2, 3]  # 8 others, 2 a page
    assert {r.pages for r in requests} == {4}
    assert all(len(r.recipients) <= 2 for r in requests)
    assert len(fed.messages("sealed_keys")) == 4
    assert _boxes_per_device(fed) == Counter(d for d in fed.device_ids if d != agent)
    assert fed.coordinator.is_done
    assert all(c.epoch_view.secret_key is not None for c in fed.devices.values())


def test_a_coordinator_killed_mid_paging_asks_only_for_the_open_pages(
    federation: Any,
) -> None:
    fed = federation(num_devices=9, k=2, tries=2, rounds=1, seal_page_size=2)
    fed.bus.drop_filter = _drop_boxes_of_pages(2)
    fed.start()
    agent = _agent(fed)
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    assert sorted(r.page for _, r in fed.messages("seal_request")) == [0, 1, 2, 3]
    sealed_before = _boxes_per_device(fed)
    assert len(sealed_before) == 4  # pages 0 and 1

    fed.coordinator_transport.kill()  # kill -9
    fed.coordinator.store.close()
    fed.bus.drop_filter = None
    before = len(fed.messages("seal_request"))
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    fed.settle()  # silence means no: let the round's volunteering window close

    resent = [m for _, m in fed.messages("seal_request")[before:]]
    assert sorted(r.page for r in resent) == [2, 3]
    assert _boxes_per_device(fed) == Counter(d for d in fed.device_ids if d != agent)
    assert fed.coordinator.is_done


def test_boxes_lost_in_the_outbox_at_a_kill_are_sealed_again_after_the_restart(
    federation: Any,
) -> None:
    """Pages complete in the store, their relayed boxes never sent (kill -9)."""
    fed = federation(num_devices=9, k=2, tries=2, rounds=1, seal_page_size=2)
    lost = set(fed.device_ids[-4:])  # their boxes die with the coordinator

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        message = _message(payload) if s == "coordinator" else None
        if message is None or message.kind != "sealed_secret_key":
            return False
        return bool(message.recipient in lost)

    fed.bus.drop_filter = drop
    fed.start()
    lost.discard(_agent(fed))  # the agent keeps its own key
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    assert not any(fed.devices[d].epoch_view.secret_key for d in lost)

    fed.coordinator_transport.kill()
    fed.coordinator.store.close()
    fed.bus.drop_filter = None
    before = len(fed.messages("seal_request"))
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    fed.settle()

    requests = fed.messages("seal_request")[before:]
    resent = {keys.device_id for _, m in requests for keys in m.recipients}
    assert lost <= resent
    assert all(fed.devices[d].epoch_view.secret_key is not None for d in lost)
    assert fed.coordinator.is_done


def test_a_stalled_agent_is_asked_again_and_finishes_after_its_restart(
    federation: Any,
) -> None:
    deadlines = fed_deadlines(registration_s=30)  # the agent is asked at 10 s
    fed = federation(
        num_devices=9, k=2, tries=2, rounds=1, seal_page_size=2, deadlines=deadlines
    )
    fed.bus.drop_filter = _drop_boxes_of_pages(2)
    fed.start()
    agent = _agent(fed)
    key_before = fed.devices[agent].epoch_view.secret_key.secret_to_bytes()
    fed.transports[agent].kill()  # the agent dies after sealing pages 2 and 3
    fed.bus.drop_filter = None
    fed.new_device(agent).start()  # and comes back with its state directory
    assert fed.coordinator.state.stage is Stage.REGISTRATION

    fed.tick(11)  # no boxes for longer than deadlines.agent_s: pages 2, 3 again
    fed.settle()

    keys = {m.public_key for _, m in fed.messages("agent_public_key")}
    assert len(keys) == 1
    assert _boxes_per_device(fed) == Counter(d for d in fed.device_ids if d != agent)
    secrets = {c.epoch_view.secret_key.secret_to_bytes() for c in fed.devices.values()}
    assert secrets == {key_before}
    assert fed.coordinator.is_done


def _seal_requests_after_outage(fed: Any, outage_s: float) -> int:
    """Seal requests 11 s after the last page, ``outage_s`` of them a link outage."""
    fed.bus.drop_filter = _drop_boxes_of_pages(2)  # pages 2 and 3 never complete
    fed.start()
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    before = len(fed.messages("seal_request"))
    link = bridge_state_topic("site-a")
    fed.raw.publish(link, b"1")
    fed.raw.publish(link, b"0")
    fed.clock.advance(outage_s)
    fed.raw.publish(link, b"1")
    fed.tick(11 - outage_s)  # deadlines.agent_s is 10
    return len(fed.messages("seal_request")) - before


def test_a_link_outage_gives_a_stalled_sealing_its_time_back(federation: Any) -> None:
    def fleet() -> Any:
        deadlines = fed_deadlines(registration_s=60)
        return federation(
            num_devices=9, k=2, tries=2, rounds=1, seal_page_size=2, deadlines=deadlines
        )

    assert _seal_requests_after_outage(fleet(), 0.0) > 0  # asked again at 10 s
    assert _seal_requests_after_outage(fleet(), 8.0) == 0  # 3 s without the outage


def test_sealing_progress_keeps_registration_open_past_its_deadline(
    federation: Any,
) -> None:
    fed = federation(num_devices=7, k=2, tries=2, rounds=1, seal_page_size=2)
    held: list[tuple[str, bytes]] = []

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        message = _message(payload) if r == "coordinator" else None
        if message is None:
            return False
        if message.kind == "sealed_keys" and message.page == 2:
            held.append((topic, payload))
            return True
        return bool(message.kind == "registration" and s == _victim(fed))

    fed.bus.drop_filter = drop
    fed.start()
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    fed.tick(9)
    fed.bus.drop_filter = lambda s, r, t, p: (
        r == "coordinator"
        and s == _victim(fed)
        and (m := _message(p)) is not None
        and m.kind == "registration"
    )
    (topic, payload), *_ = held
    fed.raw.publish(topic, payload)  # the last page's boxes, 9 s late

    fed.tick(8)  # past registration_s (10 s), within a page's extension
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    fed.tick(3)

    assert fed.coordinator.state.stage is not Stage.REGISTRATION
    (_, registry_sum), *_ = fed.messages("registry_sum")
    assert registry_sum.num_parties == 6  # all but the victim


def _victim(fed: Any, rank: int = 0) -> str:
    """The `rank`-th device that is not the agent (once the epoch has one)."""
    notices = fed.messages("key_epoch_start")
    agent = notices[0][1].agent if notices else None
    return str([d for d in fed.device_ids if d != agent][rank])


def test_registration_stops_waiting_for_a_device_that_leaves_until_it_returns(
    federation: Any,
) -> None:
    fed = federation(num_devices=6, k=2, tries=2, rounds=1, quorum=3)
    fed.bus.drop_filter = lambda s, r, t, p: (
        r == "coordinator"
        and s in (_victim(fed, 0), _victim(fed, 1))
        and (m := _message(p)) is not None
        and m.kind == "registration"
    )
    fed.start()
    first, second = _victim(fed, 0), _victim(fed, 1)
    assert fed.coordinator.state.stage is Stage.REGISTRATION
    fed.transports[first].kill()  # registration waits for the second only
    fed.tick(3)
    fed.new_device(first).start()  # back (still silent): waited for again
    fed.tick(3)
    fed.transports[second].kill()
    fed.tick(3)

    assert fed.coordinator.state.stage is Stage.REGISTRATION
    fed.transports[first].kill()
    assert fed.coordinator.state.stage is not Stage.REGISTRATION
    (_, registry_sum), *_ = fed.messages("registry_sum")
    assert registry_sum.num_parties == 4


def test_a_registry_slot_holds_counts_up_to_100000_parties() -> None:
    public_key, secret_key = generate_keypair(512)
    layout = PackingLayout(1, 100_000, 512)
    one_hots = [[1 if i == slot else 0 for i in range(56)] for slot in (0, 0, 55)]
    summed = sum_encrypted(
        public_key, (encrypt_vector(public_key, layout, v) for v in one_hots)
    )

    counts = decrypt_vector(secret_key, layout, summed)

    assert layout.slot_bits == 18 and counts[0] == 2 and counts[55] == 1


def test_boxes_for_the_agent_or_a_second_time_are_not_relayed(
    federation: Any,
) -> None:
    fed = federation(num_devices=4, k=2, tries=2, rounds=1)
    fed.start()
    agent = _agent(fed)
    (_, sealed), *_ = fed.messages("sealed_keys")
    other = sealed.boxes[0].recipient
    boxes = (
        SealedBox(recipient=agent, box=b"x"),
        SealedBox(recipient=other, box=b"y"),
    )
    before = _boxes_per_device(fed)

    fed.send_as(
        agent, sealed.model_copy(update={"message_id": "again", "boxes": boxes})
    )

    assert _boxes_per_device(fed) == before
    assert fed.errors_to(agent) == []
