"""An active coordinator against the operator's root of trust (issue 29, item 1).

The coordinator holds its own signing key but not the operator's. Each test
makes it depart from the protocol once, as the issue's rows did: a signed
`key_epoch_start` naming a made-up agent (keys it generated, the agent's
public key and one sealed box per device "from" that agent), a `ring_start`
with one member's keys swapped, a secure-aggregation roster with one peer's
keys swapped. Under ``[trust]`` every device refuses with
``untrusted_identity``; the same attack on a tofu fleet succeeds (the
control), so each test can fail. Real coordinator and SDK on the in-memory
bus, 512-bit Paillier keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.coordinator.conftest import FEDERATION, Federation
from ursa.crypto.certificate import OperatorKey, Role
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.paillier import PaillierSecretKey, generate_keypair
from ursa.crypto.sealing import seal
from ursa.edge_sdk.key_epoch import seal_context
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.messages import (
    COORDINATOR,
    AgentPublicKey,
    BaseMessage,
    DeviceKeys,
    KeyEpochStart,
    SealedSecretKey,
    SealRequest,
)
from ursa.protocol.topics import down_topic, global_topic, name_for
from ursa.tools.cli.operator import certify
from ursa.tools.operator_provisioning import OperatorProvisioning

UNTRUSTED = "untrusted_identity"


def operator_fleet(
    tmp_path: Path,
    *,
    trusted: bool,
    num_devices: int = 4,
    coordinator_certified: bool = True,
    **overrides: Any,
) -> Federation:
    """A fleet whose coordinator and devices hold operator certificates (or none)."""
    operator = OperatorProvisioning(tmp_path / "operator", FEDERATION)
    if trusted and coordinator_certified:
        overrides["trust"] = operator.coordinator(tmp_path / "coordinator")
    fed = Federation(tmp_path, num_devices=num_devices, **overrides)
    fed.operator = operator  # type: ignore[attr-defined]
    if trusted:
        fed.device_trust = {d: operator.device(tmp_path / d, d) for d in fed.device_ids}
    return fed


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[Callable[..., Federation]]:
    made: list[tuple[Federation, bool]] = []

    def make(trusted: bool, **overrides: Any) -> Federation:
        fed = operator_fleet(
            tmp_path / ("trusted" if trusted else "tofu"), trusted=trusted, **overrides
        )
        made.append((fed, trusted))
        return fed

    yield make
    for fed, trusted in made:
        fed.close()
        assert fed.bus.handler_errors == 0 or not trusted


def coordinator_key(fed: Federation) -> DeviceIdentity:
    """The coordinator's own signing key: what an active coordinator does hold."""
    return DeviceIdentity.load_or_create(fed.config.state_dir, COORDINATOR)


def signed(key: DeviceIdentity, message: BaseMessage) -> BaseMessage:
    return message.model_copy(update={"signature": key.sign(signing_bytes(message))})


def refusals(fed: Federation, device: str) -> list[str]:
    """Codes of the error replies ``device`` sent the coordinator."""
    return [
        m.code for t, m in fed.messages("error") if m.sender == device and "/up/" in t
    ]


def holds(client: Any, secret_key: PaillierSecretKey) -> bool:
    """Whether ``client`` took ``secret_key`` as its epoch's key."""
    own = client.epoch_view.secret_key
    return own is not None and own.secret_to_bytes() == secret_key.secret_to_bytes()


# --- the made-up agent -------------------------------------------------------


Publish = Callable[[str, bytes], None]


def forge_agent(
    publish: Publish,
    real: KeyEpochStart,
    coordinator: DeviceIdentity,
    recipients: Mapping[str, DevicePublicIdentity],
    agent: str,
    certificate: Callable[[DeviceIdentity], bytes],
    key_bits: int = 512,
) -> tuple[int, PaillierSecretKey]:
    """Sign an epoch naming ``agent`` with keys the coordinator made; seal to all.

    What the issue's attacker sent, on whatever bus ``publish`` writes to:
    the signed notice after ``real``, the made-up agent's signed public key
    and one box per recipient "from" it. Returns the forged epoch and the
    secret key a device that fell for it holds.
    """
    federation, fake = real.federation, DeviceIdentity.generate(agent)
    epoch = real.epoch + 1
    keys = DeviceKeys(
        device_id=agent,
        x25519_public=fake.public().x25519_public,
        ed25519_public=fake.public().ed25519_public,
        certificate=certificate(fake),
    )
    notice = KeyEpochStart.model_validate(
        {
            **real.model_dump(),
            "message_id": uuid.uuid4().hex,
            "epoch": epoch,
            "agent": agent,
            "agent_keys": keys,
            "signature": b"",
        }
    )
    publish(
        global_topic(federation, name_for(notice.kind)),
        encode(signed(coordinator, notice)),
    )
    public_key, secret_key = generate_keypair(key_bits)
    head = {"federation": federation, "run": real.run, "round": 0, "sender": agent}
    announce = AgentPublicKey(**head, epoch=epoch, public_key=public_key.to_bytes())
    publish(
        global_topic(federation, name_for(announce.kind)),
        encode(signed(fake, announce)),
    )
    context, plaintext = seal_context(federation, epoch), secret_key.secret_to_bytes()
    for device, public in recipients.items():
        box = seal(fake, public, context, plaintext)
        sealed = SealedSecretKey(**head, epoch=epoch, recipient=device, box=box)
        publish(down_topic(federation, device, name_for(sealed.kind)), encode(sealed))
    return epoch, secret_key


def made_up_agent(
    fed: Federation, agent: str, certificate: Callable[[DeviceIdentity], bytes]
) -> tuple[int, PaillierSecretKey]:
    """`forge_agent` on the in-memory bus, after the fleet's last real epoch."""
    recipients = {d: c.link.identity.public() for d, c in fed.devices.items()}
    forged = forge_agent(
        fed.raw.publish,
        fed.messages("key_epoch_start")[-1][1],
        coordinator_key(fed),
        recipients,
        agent,
        certificate,
    )
    fed.bus.flush()
    return forged


def no_certificate(_fake: DeviceIdentity) -> bytes:
    return b""


def certified_elsewhere(fake: DeviceIdentity) -> bytes:
    """A certificate for the made-up keys from a key that is not the operator's."""
    other = OperatorKey.generate()
    return certify(other, Role.DEVICE, fake.public(), federation=FEDERATION).to_bytes()


ATTACKS = {
    "a ghost agent without a certificate": ("ghost", no_certificate),
    "an enrolled device's id, made-up keys, no certificate": ("d01", no_certificate),
    "made-up keys certified by another key": ("d01", certified_elsewhere),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_made_up_agent_is_refused_by_every_device(
    fleets: Callable[..., Federation], attack: str
) -> None:
    agent, certificate = ATTACKS[attack]
    fed = fleets(trusted=True)
    fed.start(settle=False)
    adopted = {d: c.epoch for d, c in fed.devices.items()}
    assert set(adopted.values()) == {1}

    epoch, secret_key = made_up_agent(fed, agent, certificate)

    for device, client in fed.devices.items():
        assert client.epoch == adopted[device] != epoch
        assert not holds(client, secret_key)
        assert UNTRUSTED in refusals(fed, device)
    assert fed.bus.handler_errors == 0


def test_a_relayed_certificate_of_other_keys_is_refused(
    fleets: Callable[..., Federation],
) -> None:
    """The real d01's certificate next to made-up keys for d01."""
    fed = fleets(trusted=True)
    fed.start(settle=False)
    genuine = fed.coordinator.device_certificate("d01")
    assert genuine

    epoch, _ = made_up_agent(fed, "d01", lambda _fake: genuine)

    assert all(c.epoch != epoch for c in fed.devices.values())
    assert all(UNTRUSTED in refusals(fed, d) for d in fed.devices)


def test_control_a_tofu_fleet_falls_for_the_made_up_agent(
    fleets: Callable[..., Federation],
) -> None:
    fed = fleets(trusted=False)
    fed.start(settle=False)

    epoch, secret_key = made_up_agent(fed, "ghost", no_certificate)

    for device, client in fed.devices.items():
        assert client.epoch == epoch
        assert holds(client, secret_key)  # the coordinator reads it all
        assert UNTRUSTED not in refusals(fed, device)


def sealed_to_ghost(fed: Federation, agent: str) -> bool:
    return any(
        m.sender == agent and any(b.recipient == "ghost" for b in m.boxes)
        for _, m in fed.messages("sealed_keys")
    )


def ask_to_seal_to_a_ghost(fed: Federation) -> str:
    """Ask the epoch's agent to seal its secret key to keys the coordinator made."""
    notice = fed.messages("key_epoch_start")[-1][1]
    ghost = DeviceIdentity.generate("ghost").public()
    request = SealRequest(
        federation=FEDERATION,
        round=0,
        sender=COORDINATOR,
        epoch=notice.epoch,
        recipients=(
            DeviceKeys(
                device_id="ghost",
                x25519_public=ghost.x25519_public,
                ed25519_public=ghost.ed25519_public,
            ),
        ),
    )
    request = request.model_copy(update={"run": fed.coordinator.run_id})
    fed.send_down(notice.agent, signed(coordinator_key(fed), request))  # its own key
    return str(notice.agent)


def test_the_agent_seals_its_key_to_no_uncertified_recipient(
    fleets: Callable[..., Federation],
) -> None:
    fed = fleets(trusted=True)
    fed.start(settle=False)

    agent = ask_to_seal_to_a_ghost(fed)

    assert UNTRUSTED in refusals(fed, agent)
    assert not sealed_to_ghost(fed, agent)


def test_control_a_tofu_agent_seals_its_key_to_the_ghost(
    fleets: Callable[..., Federation],
) -> None:
    fed = fleets(trusted=False)
    fed.start(settle=False)

    agent = ask_to_seal_to_a_ghost(fed)

    assert sealed_to_ghost(fed, agent)


def test_a_coordinator_the_operator_did_not_certify_is_refused(
    fleets: Callable[..., Federation],
) -> None:
    fed = fleets(trusted=True, coordinator_certified=False)
    fed.start(settle=False)

    for device, client in fed.devices.items():
        assert not client.enrolled.is_set()
        assert client.link.coordinator is None  # not pinned on first use
        assert UNTRUSTED in refusals(fed, device)


def test_operator_fleet_runs_every_round(fleets: Callable[..., Federation]) -> None:
    fed = fleets(trusted=True)
    fed.start()

    assert fed.coordinator.is_done
    assert all(refusals(fed, d) == [] for d in fed.devices)
    notice = fed.messages("key_epoch_start")[0][1]
    assert notice.agent_keys.certificate  # relayed with the agent's keys
    hello = [m for _, m in fed.messages("hello")]
    assert hello and all(m.certificate for m in hello)
    assert np.all([c.epoch == 1 for c in fed.devices.values()])


# --- a swapped ring member ---------------------------------------------------

VICTIM, SWAPPED = "d00", "d01"


def swapping(
    fed: Federation, kind: str, swap: Callable[[Any, DeviceIdentity], Any]
) -> DeviceIdentity:
    """Deliver VICTIM every ``kind`` with SWAPPED's keys swapped, re-signed.

    The coordinator's outbox turned hostile: ``swap`` puts the keys it made
    in SWAPPED's place (SWAPPED's genuine certificate stays beside them).
    """
    coordinator, fake = coordinator_key(fed), DeviceIdentity.generate(SWAPPED)
    raw = fed.raw  # attached now, not while the bus routes

    def drop(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        if receiver != VICTIM or sender != "coordinator" or not payload:
            return False
        message = decode(payload)
        if message.kind != kind:
            return False
        raw.publish(topic, encode(signed(coordinator, swap(message, fake))))
        return True

    fed.bus.drop_filter = drop
    return fake


def swapped_keys(keys: DeviceKeys, fake: DeviceIdentity) -> DeviceKeys:
    if keys.device_id != SWAPPED:
        return keys
    public = fake.public()
    return keys.model_copy(
        update={
            "x25519_public": public.x25519_public,
            "ed25519_public": public.ed25519_public,
        }
    )


def swap_member(message: Any, fake: DeviceIdentity) -> Any:
    members = tuple(swapped_keys(k, fake) for k in message.members)
    return message.model_copy(update={"members": members, "signature": b""})


def flicker_fleet(fleets: Callable[..., Federation], trusted: bool) -> Federation:
    from ursa.coordinator.methods_config import DubheSpec, FlickerSpec
    from ursa.edge_sdk import methods_config as device_methods

    pytest.importorskip("tenseal")
    fed = fleets(
        trusted=trusted,
        num_devices=4,
        k=2,
        tries=2,
        rounds=1,
        methods=(DubheSpec(), FlickerSpec(reply_deadline_s=30.0)),
    )
    fed.device_methods = (
        device_methods.DubheDeviceSpec(),
        device_methods.FlickerDeviceSpec(),
    )
    return fed


def ring_peer(fed: Federation) -> Any:
    from ursa.edge_sdk.methods.flicker.method import Flicker

    participant = fed.devices[VICTIM].method(Flicker).participant
    assert participant is not None
    return participant.peers.get(SWAPPED)


def test_a_swapped_ring_member_is_refused(fleets: Callable[..., Federation]) -> None:
    fed = flicker_fleet(fleets, trusted=True)
    fake = swapping(fed, "ring_start", swap_member)

    fed.start(settle=False)

    assert fed.messages("ring_start")
    assert UNTRUSTED in refusals(fed, VICTIM)
    assert ring_peer(fed) != fake.public()


def test_control_a_tofu_ring_takes_the_swapped_member(
    fleets: Callable[..., Federation],
) -> None:
    fed = flicker_fleet(fleets, trusted=False)
    fake = swapping(fed, "ring_start", swap_member)

    fed.start(settle=False)

    assert ring_peer(fed) == fake.public()  # its hop would be sealed to the fake
    assert UNTRUSTED not in refusals(fed, VICTIM)


# --- a swapped secure-aggregation peer ------------------------------------------


def swap_peer(message: Any, fake: DeviceIdentity) -> Any:
    """SWAPPED's identity and round keys replaced by the fake's, signed by it."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from ursa.protocol.secure_aggregation import advert_transcript

    peers = []
    for peer in message.peers:
        if peer.identity.device_id == SWAPPED:
            c_public, s_public = (
                X25519PrivateKey.generate().public_key().public_bytes_raw()
                for _ in range(2)
            )
            transcript = advert_transcript(
                FEDERATION, message.run, message.round, SWAPPED, c_public, s_public
            )
            peer = peer.model_copy(
                update={
                    "identity": swapped_keys(peer.identity, fake),
                    "c_public": c_public,
                    "s_public": s_public,
                    "advert_signature": fake.sign(transcript),
                }
            )
        peers.append(peer)
    return message.model_copy(update={"peers": tuple(peers), "signature": b""})


def secure_round(fleets: Callable[..., Federation], trusted: bool) -> Federation:
    from tests.coordinator.test_training import start_training
    from ursa.coordinator.secure_aggregation.config import AggregationConfig
    from ursa.coordinator.training import TrainingConfig

    fed = fleets(trusted=trusted, num_devices=3, k=3, tries=1, rounds=1)
    swapping(fed, "secagg_roster", swap_peer)
    config = TrainingConfig(
        aggregation=AggregationConfig(mode="secure", clip_norm=1.0, max_examples=50)
    )
    start_training(fed, fed.tmp_path, config)
    return fed


def shared_with_swapped(fed: Federation) -> bool:
    """Whether VICTIM sealed a share pair to (what it took for) SWAPPED."""
    return any(
        m.sender == VICTIM and any(b.peer == SWAPPED for b in m.boxes)
        for _, m in fed.messages("secagg_shares")
    )


def test_a_swapped_secure_aggregation_peer_is_refused(
    fleets: Callable[..., Federation],
) -> None:
    fed = secure_round(fleets, trusted=True)

    assert fed.messages("secagg_roster")
    assert UNTRUSTED in refusals(fed, VICTIM)
    assert not shared_with_swapped(fed)


def test_control_a_tofu_device_shares_with_the_swapped_peer(
    fleets: Callable[..., Federation],
) -> None:
    fed = secure_round(fleets, trusted=False)

    assert shared_with_swapped(fed)  # sealed to keys the coordinator made
    assert UNTRUSTED not in refusals(fed, VICTIM)
