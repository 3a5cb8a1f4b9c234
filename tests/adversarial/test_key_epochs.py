"""Key epochs: one device's refusals cannot make the fleet key again and again.

Issue 28's row: two devices alternating an unauthenticated
``coordinator_identity_mismatch`` reply started 41 key epochs in a row (40
replies). A refusal now counts only when the device signed it and it names
the acceptance the coordinator sent it; a counted one re-keys at most
``[key_epochs] refusal_rekeys`` times per device per window, then the device
sits out. Real coordinator and SDK over the in-memory bus, fake clock, 512-bit
Paillier keys. The honest fleet's outcome is asserted each time: every round
done, no key epoch but the ones the bound allows.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.coordinator.conftest import Federation, device_labels
from tests.refusing_device import RefusingDevice
from ursa.coordinator.config import KeyEpochConfig
from ursa.coordinator.round_state import Stage
from ursa.crypto.identity import DeviceIdentity
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.protocol.envelope import decode
from ursa.protocol.inmemory import InMemoryTransport

ATTACKERS = ("d04", "d05")
HELD = "d00"
"""An honest device whose registrations are lost: registration stays open."""
ROUNDS = 2


@pytest.fixture
def fleet() -> Iterator[Callable[..., Federation]]:
    """Six devices in REGISTRATION (HELD's registrations are lost), two hostile.

    A quorum of 3: a new key epoch goes ahead without both attackers.
    """
    made: list[tuple[Federation, tempfile.TemporaryDirectory[str]]] = []

    def make(**overrides: Any) -> Federation:
        tmp = tempfile.TemporaryDirectory()
        settings = {"k": 2, "tries": 1, "rounds": ROUNDS, "quorum": 3, **overrides}
        fed = Federation(Path(tmp.name), num_devices=6, **settings)
        made.append((fed, tmp))
        fed.bus.drop_filter = _lose_registrations_of(HELD)
        for device in ATTACKERS:  # the test holds their keys, the SDK loads them
            DeviceIdentity.load_or_create(fed.tmp_path / device, device)
        fed.start(settle=False)
        assert fed.coordinator.state.stage is Stage.REGISTRATION
        return fed

    yield make
    for fed, tmp in made:
        fed.close()
        assert fed.bus.handler_errors == 0
        tmp.cleanup()


def _lose_registrations_of(device: str) -> Callable[[str, str, str, bytes], bool]:
    def drop(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        if sender != device or receiver != "coordinator":
            return False
        return bool(decode(payload).kind == "registration")

    return drop


def key_epochs(fed: Federation) -> int:
    return len(fed.messages("key_epoch_start"))


def answers(fed: Federation, device: str) -> list[str]:
    """Codes of the coordinator's error answers to ``device``."""
    return [e.code for e in fed.errors_to(device)]


def finish(fed: Federation) -> None:
    """Let registration close at its deadline and the rounds run."""
    fed.bus.drop_filter = None
    fed.tick(fed.config.deadlines.registration_s)
    fed.settle()
    assert fed.coordinator.is_done
    assert fed.coordinator.store.completed_rounds() == ROUNDS


def test_the_table_row_unsigned_alternating_refusals_start_no_key_epoch(
    fleet: Callable[..., Federation], caplog: pytest.LogCaptureFixture
) -> None:
    fed = fleet()
    hostile = [RefusingDevice(fed, d) for d in ATTACKERS]
    caplog.set_level(logging.WARNING, logger="ursa.coordinator")

    for i in range(40):  # the attack: refuse, say Hello, the other one
        attacker = hostile[i % 2]
        attacker.refuse(None, signer=None)
        attacker.hello()

    assert key_epochs(fed) == 1  # was 41
    assert fed.coordinator.state.epoch == 1
    assert all(answers(fed, d).count("unauthorised") == 20 for d in ATTACKERS)
    assert "refuses this coordinator" not in caplog.text
    finish(fed)
    assert key_epochs(fed) == 1


def test_an_unsigned_refusal_of_a_real_acceptance_is_rejected(
    fleet: Callable[..., Federation],
) -> None:
    fed = fleet()
    attacker = RefusingDevice(fed, ATTACKERS[0])
    attacker.refuse(attacker.acceptances()[-1], signer=None)

    assert answers(fed, attacker.device) == ["bad_signature"]
    assert key_epochs(fed) == 1
    assert attacker.device in fed.coordinator.online_devices()  # nothing changed
    finish(fed)
    assert key_epochs(fed) == 1


def test_a_refusal_signed_with_another_devices_key_is_rejected(
    fleet: Callable[..., Federation],
) -> None:
    fed = fleet()
    attacker = RefusingDevice(fed, ATTACKERS[0])
    victim = RefusingDevice(fed, ATTACKERS[1])  # whose key the attacker stole
    attacker.refuse(attacker.acceptances()[-1], signer=victim.identity)
    # and the victim's own acceptance, refused on the attacker's topic
    attacker.refuse(victim.acceptances()[-1], signer=victim.identity)

    assert answers(fed, attacker.device) == ["bad_signature", "unauthorised"]
    assert not answers(fed, victim.device)
    assert key_epochs(fed) == 1
    assert {attacker.device, victim.device} <= fed.coordinator.online_devices()
    finish(fed)
    assert key_epochs(fed) == 1


def test_a_refusal_naming_a_message_never_sent_is_rejected(
    fleet: Callable[..., Federation],
) -> None:
    fed = fleet()
    attacker = RefusingDevice(fed, ATTACKERS[0])
    acceptance = attacker.acceptances()[-1]
    notice = fed.messages("key_epoch_start")[-1][1]  # sent, but no acceptance
    attacker.refuse(None, in_reply_to=uuid.uuid4().hex, digest="0" * 64)
    attacker.refuse(None, in_reply_to=acceptance.message_id, digest="0" * 64)
    attacker.refuse(notice)
    altered = acceptance.model_copy(update={"epoch": 7})  # not what was sent
    attacker.refuse(altered)

    assert answers(fed, attacker.device) == ["unauthorised"] * 4
    assert key_epochs(fed) == 1
    finish(fed)
    assert key_epochs(fed) == 1


def test_a_replayed_refusal_of_an_older_epoch_starts_nothing(
    fleet: Callable[..., Federation],
) -> None:
    fed = fleet()
    attacker = RefusingDevice(fed, ATTACKERS[0])
    first = attacker.refuse(attacker.acceptances()[-1])  # counted: key epoch 2
    assert key_epochs(fed) == 2
    old = attacker.acceptances()[-1]
    attacker.hello()  # back in the fleet, with a new acceptance
    assert fed.coordinator.state.epoch == 2
    other = RefusingDevice(fed, ATTACKERS[1])
    other.refuse(other.acceptances()[-1])  # counted: key epoch 3 counts d04
    assert key_epochs(fed) == 3
    before = answers(fed, attacker.device)

    fed.send_as(attacker.device, first)  # the same bytes: a duplicate
    attacker.refuse(old)  # re-signed (a new id): an older acceptance
    attacker.refuse(old, signer=None)

    assert answers(fed, attacker.device)[len(before) :] == ["unauthorised"] * 2
    assert key_epochs(fed) == 3
    assert attacker.device in fed.coordinator.online_devices()
    finish(fed)
    assert key_epochs(fed) == 3


def test_signed_alternating_refusals_rekey_once_per_device_then_sit_out(
    fleet: Callable[..., Federation], caplog: pytest.LogCaptureFixture
) -> None:
    fed = fleet()
    hostile = [RefusingDevice(fed, d) for d in ATTACKERS]
    held = [h.acceptances()[-1] for h in hostile]
    caplog.set_level(logging.WARNING, logger="ursa.coordinator")

    for i in range(40):  # the row again, but each reply signed and named
        attacker = hostile[i % 2]
        attacker.refuse(held[i % 2])
        held[i % 2] = attacker.hello()

    assert key_epochs(fed) == 3  # one per device (refusal_rekeys = 1)
    assert "d04 sits key epoch 3 out instead of keying again" in caplog.text
    finish(fed)
    assert key_epochs(fed) == 3
    selected = {d for _, m in fed.messages("selection_result") for d in m.selected}
    assert not selected & set(ATTACKERS)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rekeys=st.integers(min_value=0, max_value=3),
    order=st.lists(st.sampled_from(ATTACKERS), min_size=1, max_size=16),
)
def test_one_devices_refusals_rekey_at_most_refusal_rekeys_times(
    fleet: Callable[..., Federation],
    caplog: pytest.LogCaptureFixture,
    rekeys: int,
    order: list[str],
) -> None:
    """Signed refusals in any order, each followed by a Hello (a new acceptance)."""
    fed = fleet(key_epochs=KeyEpochConfig(refusal_rekeys=rekeys))
    hostile = {d: RefusingDevice(fed, d) for d in ATTACKERS}
    held = {d: h.acceptances()[-1] for d, h in hostile.items()}
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="ursa.coordinator")

    for device in order:
        hostile[device].refuse(held[device])
        held[device] = hostile[device].hello()

    caused = {d: caplog.text.count(f"counted {d}; keying again") for d in ATTACKERS}
    assert all(n <= rekeys for n in caused.values())
    assert key_epochs(fed) == 1 + sum(caused.values()) <= 1 + 2 * rekeys
    if rekeys:  # the first refusal counts: epoch 1 counted everyone
        assert caused[order[0]] >= 1
    finish(fed)


def test_an_honest_device_that_pinned_another_coordinator_is_keyed_out(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The documented outcome: one ERROR each side; the epoch that counted it
    keys again without it, once; the fleet runs on without it."""
    fed = Federation(tmp_path, num_devices=5, k=2, tries=1, rounds=ROUNDS, quorum=4)
    misfit = fed.device_ids[-1]  # its Hello completes min_devices: epoch 1 counts it
    other = DeviceIdentity.generate("coordinator").public().fingerprint()
    caplog.set_level(logging.INFO)
    fed.coordinator.start()
    for index, device in enumerate(fed.device_ids):
        config = fed.device_config(device)
        if device == misfit:
            config = config.model_copy(update={"coordinator_fingerprint": other})
        topic, will = device_will(config)
        transport = InMemoryTransport(fed.bus, device, will=(topic, will, True))
        client = EdgeClient(
            config,
            device_labels(index),
            transport=transport,
            rng=np.random.default_rng(index),
        )
        fed.devices[device], fed.transports[device] = client, transport
        client.start()
    fed.settle()

    try:
        refusals = [
            m
            for _, m in fed.messages("error")
            if m.code == "coordinator_identity_mismatch"
        ]
        assert refusals and {m.sender for m in refusals} == {misfit}
        assert all(m.signature and m.in_reply_to_digest for m in refusals)
        assert f"{misfit} refuses this coordinator" in caplog.text
        assert f"key epoch 1 counted {misfit}; keying again" in caplog.text
        notices = [m for _, m in fed.messages("key_epoch_start")]
        assert [n.epoch for n in notices] == [1, 2]
        second = fed.coordinator.store.epoch(2)
        assert second is not None and misfit not in second.recipients
        assert fed.coordinator.is_done
        assert fed.coordinator.store.completed_rounds() == ROUNDS
        selected = {d for _, m in fed.messages("selection_result") for d in m.selected}
        assert misfit not in selected
        assert not {"unauthorised", "bad_signature"} & set(answers(fed, misfit))
    finally:
        fed.close()
    assert fed.bus.handler_errors == 0
