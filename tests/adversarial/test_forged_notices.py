"""Notices forged on the coordinator's topics (issue 29, item 3's second half).

Whoever can publish where the coordinator does — a leaked broker login, a
broker that injects, an ACL mistake — used to steer devices with the unsigned
notices they act on (`round_announce`, `registry_sum`, `try_assignment`,
`model_available` and its manifest, `mean_sum`, ...). Now every coordinator
message but a chunk is signed at one point and checked at one point; a
chunk's bytes are bound by the signed manifest's SHA-256, and a round's model
by the SHA-256 in its signed `model_available`.

The hostile broker is the in-memory bus's delivery filter: it replaces what
the coordinator sends one device (``VICTIM``). Each refusal test has its
control in the honest run (the same kind reaches the victim's handlers), so
it can fail. Real coordinator and SDK, 512-bit Paillier keys.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.training import TrainingConfig
from ursa.crypto.identity import DeviceIdentity, verify_signature
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.models.weights import arrays_to_bytes
from ursa.protocol.chunking import split
from ursa.protocol.envelope import decode, encode, signing_bytes
from ursa.protocol.messages import COORDINATOR, BaseMessage, Chunk, TransferManifest
from ursa.tests.adversarial.test_trust_anchor import (
    coordinator_key,
    flicker_fleet,
    refusals,
    signed,
)
from ursa.tests.coordinator.conftest import FEDERATION, Federation
from ursa.tests.coordinator.test_training import INITIAL, start_training

VICTIM = "d01"
BAD_SIGNATURE = "bad_signature"
POISON = {k: np.full(np.shape(v), 100.0, np.float32) for k, v in INITIAL.items()}
"""The model a forger would have the victim train from."""

Forge = Callable[[BaseMessage], BaseMessage | list[BaseMessage] | None]
"""What the hostile broker delivers instead of one coordinator message (None: it)."""

RUN_OUT_TICKS = 60
"""Deadlines the fleet may run out (fake clock) when the victim does not answer."""

NOTICES = (
    "key_epoch_start",
    "registry_sum",
    "round_announce",
    "try_assignment",
    "selection_result",
    "model_available",
    "transfer_manifest",
    "secagg_setup",
    "secagg_roster",
    "secagg_share_bundle",
    "mean_request",
    "mean_sum",
)
"""Kinds a device of a Dubhe + CLIMB federation acts on, secure aggregation on."""


def hostile_broker(fed: Federation, forge: Forge) -> None:
    """Deliver ``VICTIM`` what ``forge`` makes of each coordinator message."""
    raw = fed.raw  # attached now, not while the bus routes

    def replace(sender: str, receiver: str, topic: str, payload: bytes) -> bool:
        if receiver != VICTIM or sender != COORDINATOR or not payload:
            return False
        forged = forge(decode(payload))
        if forged is None:
            return False
        victim_topic = topic.replace("/global/", f"/dev/{VICTIM}/down/")
        for message in forged if isinstance(forged, list) else [forged]:
            raw.publish(victim_topic, encode(message))
        return True

    fed.bus.drop_filter = replace


def dispatched(client: EdgeClient) -> list[str]:
    """The kinds that reach ``client``'s handlers, in order (a live list)."""
    seen: list[str] = []
    router = client.router
    original = router.dispatch

    def spy(message: BaseMessage) -> Any:
        seen.append(message.kind)  # type: ignore[attr-defined]
        return original(message)

    router.dispatch = spy  # type: ignore[method-assign]
    return seen


def training_fleet(
    tmp_path: Path,
    forge: Callable[[Federation], Forge] | None = None,
    *,
    climb: bool = True,
) -> tuple[Federation, list[str]]:
    """Three devices, all selected, Dubhe + CLIMB (or FedAvg), masked sums; one round.

    ``forge`` makes the hostile broker's forgery (it may read the
    coordinator's key off the new fleet); the list is what reached the
    victim's handlers.
    """
    fed = Federation(tmp_path, num_devices=3, k=3, tries=2, rounds=1)
    seen: list[list[str]] = []

    def prepare(client: EdgeClient) -> None:
        if client.device_id == VICTIM:
            seen.append(dispatched(client))

    if forge is not None:
        hostile_broker(fed, forge(fed))
    try:
        start_training(
            fed,
            tmp_path,
            TrainingConfig(),
            climb=ClimbConfig(eta_d=0.5, epsilon=0.01) if climb else None,
            prepare=prepare,
        )
        for _ in range(RUN_OUT_TICKS):  # the rounds' deadlines, for a refusing victim
            if fed.coordinator.is_done:
                break
            fed.tick(fed.config.deadlines.training_s)
    finally:
        fed.close()
    assert fed.bus.handler_errors == 0
    return fed, seen[0]


def victim_refusals(caplog: pytest.LogCaptureFixture, kind: str) -> int:
    needle = f"{VICTIM}: refused {kind}: {BAD_SIGNATURE}"
    return sum(needle in r.getMessage() for r in caplog.records)


# --- every coordinator message but a chunk is signed -------------------------


def coordinator_messages(fed: Federation) -> list[BaseMessage]:
    out = []
    for _, payload in fed.captured:
        if payload:
            message = decode(payload)
            if message.sender == COORDINATOR:
                out.append(message)
    return out


def test_every_coordinator_message_but_a_chunk_carries_its_signature(
    tmp_path: Path,
) -> None:
    fed, seen = training_fleet(tmp_path)
    key = coordinator_key(fed).public()

    sent = coordinator_messages(fed)
    for message in sent:
        if isinstance(message, Chunk):
            assert not message.signature
            continue
        verify_signature(key, signing_bytes(message), message.signature)
    kinds = {m.kind for m in sent}  # type: ignore[attr-defined]
    assert set(NOTICES) <= kinds
    assert set(NOTICES) <= set(seen)  # each reached the victim's handlers
    assert fed.coordinator.is_done


def test_every_flicker_message_of_a_service_run_is_signed(tmp_path: Path) -> None:
    fed = flicker_fleet(lambda trusted, **kw: Federation(tmp_path, **kw), False)
    try:
        fed.start()
    finally:
        fed.close()
    key = coordinator_key(fed).public()

    sent = coordinator_messages(fed)
    for message in sent:
        if not isinstance(message, Chunk):
            verify_signature(key, signing_bytes(message), message.signature)
    kinds = {m.kind for m in sent}  # type: ignore[attr-defined]
    assert {"ckks_context", "ring_start", "transfer_manifest"} <= kinds
    assert fed.bus.handler_errors == 0
    assert fed.coordinator.is_done


# --- a notice without the coordinator's signature is refused ------------------


def stripped(kind: str) -> Callable[[Federation], Forge]:
    """The broker strips the signature off ``kind``, or re-signs it with its own key."""
    return lambda fed: _stripping(kind)


def _stripping(kind: str) -> Forge:
    forger = DeviceIdentity.generate(COORDINATOR)
    count = 0

    def forge(message: BaseMessage) -> BaseMessage | None:
        nonlocal count
        if message.kind != kind:  # type: ignore[attr-defined]
            return None
        count += 1
        bare = message.model_copy(update={"signature": b""})
        return bare if count % 2 else signed(forger, bare)

    return forge


@pytest.mark.parametrize("kind", NOTICES)
def test_a_notice_not_signed_by_the_pinned_coordinator_never_reaches_a_handler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    caplog.set_level(logging.WARNING, logger="ursa.edge_sdk")
    _, seen = training_fleet(tmp_path, stripped(kind))

    assert victim_refusals(caplog, kind) >= 1
    assert kind not in seen
    others = [r for r in caplog.records if f"refused {kind}" in r.getMessage()]
    assert all(r.getMessage().startswith(f"{VICTIM}:") for r in others)


# --- a model other than the notice's -----------------------------------------


def poisoned_transfer(
    manifest: TransferManifest,
) -> tuple[TransferManifest, list[Chunk]]:
    """POISON under the real transfer's id and purpose (what the forger sends)."""
    forged, chunks = split(
        arrays_to_bytes(POISON),
        purpose=manifest.purpose,
        federation=FEDERATION,
        round=manifest.round,
        sender=COORDINATOR,
        chunk_size=manifest.chunk_size,
        transfer_id=manifest.transfer_id,
    )
    forged = forged.model_copy(update={"run": manifest.run})
    chunks = [c.model_copy(update={"run": manifest.run}) for c in chunks]
    return forged, chunks


def poisoning(
    signer: Callable[[Federation], DeviceIdentity],
) -> Callable[[Federation], Forge]:
    """Replace the victim's model transfers by POISON, the manifest signed by
    ``signer``'s key (the chunks match it)."""

    def make(fed: Federation) -> Forge:
        key = signer(fed)

        def forge(message: BaseMessage) -> BaseMessage | list[BaseMessage] | None:
            if isinstance(message, Chunk):
                return []  # the real chunks never arrive
            if not isinstance(message, TransferManifest) or ".v" not in message.purpose:
                return None
            manifest, chunks = poisoned_transfer(message)
            return [signed(key, manifest), *chunks]

        return forge

    return make


def never_held_poison(client: EdgeClient) -> bool:
    arrays = client.model_arrays
    return arrays is None or not np.allclose(arrays["w"], POISON["w"])


def test_a_forged_model_transfer_is_refused_and_never_trained_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ursa.edge_sdk")
    forger = DeviceIdentity.generate(COORDINATOR)
    fed, _ = training_fleet(tmp_path, poisoning(lambda fed: forger), climb=False)

    victim = fed.devices[VICTIM]
    assert victim_refusals(caplog, "transfer_manifest") >= 1
    assert never_held_poison(victim)
    assert victim.training_stats.rounds_trained == 0
    honest = [c for d, c in fed.devices.items() if d != VICTIM]
    assert all(c.training_stats.rounds_trained == 1 for c in honest)
    assert fed.coordinator.is_done  # the round went on without the victim


def test_a_model_that_is_not_the_signed_notices_is_not_trained_from(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The manifest signed with the coordinator's own key (an active coordinator),
    the chunks matching it: the round's signed `model_available` names other bytes."""
    caplog.set_level(logging.ERROR, logger="ursa.edge_sdk")
    fed, _ = training_fleet(tmp_path, poisoning(coordinator_key), climb=False)

    victim = fed.devices[VICTIM]
    assert not never_held_poison(victim)  # it downloaded POISON ...
    assert victim.training_stats.rounds_trained == 0  # ... and trained nothing
    assert "not the ones the signed model notice names" in caplog.text
    assert "transfer_failed" in refusals(fed, VICTIM)
    assert fed.coordinator.is_done  # the round stopped waiting for the victim
