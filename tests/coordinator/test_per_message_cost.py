"""One message, and a round's own steps, cost the same work at 1,000 and 50,000 devices.

The real service (store, admission, Dubhe) is seeded straight through its
store with N enrolled, online, registered devices and a round in SELECTING,
then handles one `Volunteer` and one last will. Per round: the tick that
closes the volunteering window short of K (Dubhe's top-up from the eligible
devices) and the tick that ends a round's training and opens the next one
(the key epoch's churn check, the announce). The work is counted, not timed:
Python trace events (calls and lines) and the peak of memory allocated during
the call, which catches C-level set copies (a frozenset of 50,000 ids is
about 2 MiB). Neither may grow with N.
"""

from __future__ import annotations

import json
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from ursa.coordinator.config import CoordinatorConfig, DeadlinesConfig, EnrolmentConfig
from ursa.coordinator.round_state import RoundState, Stage
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.stage_machine import STATE_KEY
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import PaillierPublicKey, encrypt_reals
from ursa.crypto.paillier_keys import generate_keypair
from ursa.edge_sdk.registration import DISTRIBUTION_CODEC
from ursa.protocol.envelope import encode
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import (
    AgentPublicKey,
    BaseMessage,
    RoundAnnounce,
    Status,
    Volunteer,
)
from ursa.protocol.topics import name_for, status_topic, up_topic

FED, CLASSES = "fed", 4
SMALL, LARGE = 1_000, 50_000


@pytest.fixture(scope="module")
def public_key() -> PaillierPublicKey:
    return generate_keypair(512)[0]


def seed_store(
    path: Path, n: int, key: PaillierPublicKey, *, everyone: bool = False
) -> list[str]:
    """N enrolled, online devices registered in epoch 1; round 1 is selecting.

    ``everyone``: every device a recipient of the key epoch, not the agent
    only (so the next round needs no new epoch for churn).
    """
    devices = [f"d{i:06d}" for i in range(n)]
    identity = DeviceIdentity.generate("d").public()  # one key for all: cheap
    blob, fingerprint = identity.to_bytes(), identity.fingerprint()
    running = encrypt_reals(key, DISTRIBUTION_CODEC, 2, [0.0] * CLASSES)
    public = AgentPublicKey(
        federation=FED, round=0, sender=devices[0], epoch=1, public_key=key.to_bytes()
    )
    announce = RoundAnnounce(
        federation=FED, round=1, sender="coordinator", epoch=1, k=3, tries=3,
        deadline_s=10,
    )  # fmt: skip
    with closing(CoordinatorStore(path)) as store, store.transaction():
        for device in devices:
            store.enrol(device, blob, fingerprint, 0.0)
            store.set_online(device, True)
        # recipients: the agent only (each registration rewrites the epoch's
        # row, recipients included: the key epoch's own O(N), not tested here)
        recipients = tuple(devices) if everyone else (devices[0],)
        store.add_epoch(1, devices[0], recipients, b"notice")
        store.set_public_key(1, encode(public))
        for device in devices[:-1]:  # the running sum is the last one written
            store.add_registration(1, device, b"")
        store.add_registration(1, devices[-1], running.to_bytes(key))
        store.add_round(1, 1, encode(announce))
        state = RoundState(stage=Stage.SELECTING, epoch=1, round=1)
        store.set_meta(STATE_KEY, json.dumps(state.to_json()))
    return devices


@pytest.fixture
def fleet(tmp_path: Path, public_key: PaillierPublicKey) -> Iterator[Any]:
    services: list[CoordinatorService] = []

    def make(
        n: int, clock: Callable[[], float] = lambda: 1e6, *, tries: int = 3
    ) -> tuple[CoordinatorService, list[str]]:
        state_dir = tmp_path / f"c{n}h{tries}"
        state_dir.mkdir()
        devices = seed_store(
            state_dir / DB_FILENAME, n, public_key, everyone=tries == 1
        )
        config = CoordinatorConfig(
            federation=FED,
            state_dir=state_dir,
            enrolment=EnrolmentConfig(mode="tofu"),
            min_devices=3,
            k=3,
            tries=tries,
            rounds=3,
            key_bits=512,
            seed=7,
            deadlines=DeadlinesConfig(volunteer_s=10),
        )
        transport = InMemoryTransport(InMemoryBus(), "coordinator")
        service = CoordinatorService(config, transport=transport, clock=clock)
        services.append(service)
        service.start()
        return service, devices

    yield make
    for service in services:
        service.stop()


def cost(
    service: CoordinatorService, topic: str, message: BaseMessage
) -> tuple[int, int]:
    """(Python trace events, peak bytes allocated) while handling one message."""
    payload = encode(message.model_copy(update={"run": service.run_id}))
    return work(lambda: service.handle(topic, payload))


def work(call: Callable[[], object]) -> tuple[int, int]:
    """(Python trace events, peak bytes allocated) during ``call()``."""
    events = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal events
        events += 1
        return tracer

    previous = sys.gettrace()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(previous)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return events, peak - base


def volunteer(device: str) -> tuple[str, Volunteer]:
    message = Volunteer(
        federation=FED, round=1, sender=device, draws=(True, False, False)
    )
    return up_topic(FED, device, name_for("volunteer")), message


def last_will(device: str) -> tuple[str, Status]:
    message = Status(
        federation=FED, round=0, sender=device, online=False, state="offline"
    )
    return status_topic(FED, device), message


def per_message(make: Any, n: int) -> dict[str, tuple[int, int]]:
    service, devices = make(n)
    service.handle(*_wire(service, *volunteer(devices[1])))  # warm caches
    service.handle(*_wire(service, *last_will(devices[2])))
    out = {
        "volunteer": cost(service, *volunteer(devices[3])),
        "last_will": cost(service, *last_will(devices[4])),
    }
    assert service.state.stage is Stage.SELECTING
    assert devices[4] not in service.online_devices()
    return out


def _wire(
    service: CoordinatorService, topic: str, message: BaseMessage
) -> tuple[str, bytes]:
    return topic, encode(message.model_copy(update={"run": service.run_id}))


@pytest.mark.slow
def test_one_message_costs_the_same_work_at_1000_and_50000_devices(fleet: Any) -> None:
    small, large = per_message(fleet, SMALL), per_message(fleet, LARGE)

    for kind in ("volunteer", "last_will"):
        (events_small, bytes_small), (events_large, bytes_large) = (
            small[kind],
            large[kind],
        )
        assert events_large <= 1.2 * events_small + 20, (kind, small, large)
        assert bytes_large <= 2 * bytes_small + 64 * 1024, (kind, small, large)


class Clock:
    """A clock the test moves (the service's deadlines follow it)."""

    def __init__(self) -> None:
        self.now = 1e6

    def __call__(self) -> float:
        return self.now


def per_round(make: Any, n: int) -> tuple[int, int]:
    """The work of the tick that closes a short window and opens the next round.

    H = 1 and one volunteer for K = 3: the tick tops the try up from the
    eligible devices, selects it, lets round 1 train (no training plugin:
    done at once) and opens round 2 (the churn check, the announce).
    """
    clock = Clock()
    service, devices = make(n, clock, tries=1)
    warm = Volunteer(federation=FED, round=1, sender=devices[1], draws=(True,))
    topic = up_topic(FED, devices[1], name_for("volunteer"))
    service.handle(*_wire(service, topic, warm))
    clock.now += 11  # past the volunteering window (10 s)
    spent = work(service.tick)
    record = service.store.round(1)
    assert record is not None and record.selected is not None
    assert len(record.selected) == 3 and devices[1] in record.selected
    assert service.state.stage is Stage.SELECTING and service.state.round == 2
    assert service.state.epoch == 1  # no churn, so no new key epoch
    return spent


@pytest.mark.slow
def test_a_round_costs_the_same_work_at_1000_and_50000_devices(fleet: Any) -> None:
    (events_small, bytes_small) = per_round(fleet, SMALL)
    (events_large, bytes_large) = per_round(fleet, LARGE)

    assert events_large <= 1.2 * events_small + 200, (events_small, events_large)
    assert bytes_large <= 2 * bytes_small + 64 * 1024, (bytes_small, bytes_large)


def test_the_epoch_sets_follow_departures_and_returns(fleet: Any) -> None:
    service, devices = fleet(50)
    sets = service.key_epoch.sets()
    assert sets is not None and set(sets.eligible) == set(devices)
    assert sets.members_online == {devices[0]}  # the only recipient

    service.handle(*_wire(service, *last_will(devices[5])))
    service.handle(*_wire(service, *last_will(devices[0])))
    assert set(sets.eligible) == set(devices) - {devices[0], devices[5]}
    assert sets.members_online == set()
    back = Status(federation=FED, round=0, sender=devices[5], online=True, state="idle")
    service.handle(*_wire(service, status_topic(FED, devices[5]), back))
    assert devices[5] in sets.eligible and len(sets.eligible) == 49
    assert service.key_epoch.sets() is sets  # kept, not rebuilt
