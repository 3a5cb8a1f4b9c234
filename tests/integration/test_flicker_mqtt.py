"""FLICKER's production method over a real Mosquitto: 6 live devices, one silent.

The coordinator's `FlickerMethod` runs on the lab's `FlickerHost` (the
runtime's store, signing point, router and refusals, no admission), the
devices are `FleetDevice`s (the production `FlickerParticipant`); an observer
on `#` checks that no count vector travels in plaintext. The same method
inside the whole `CoordinatorService` with `EdgeClient`s over Mosquitto is
``test_flicker_service_mqtt.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.flicker.outcome import FlickerPhase
from ursa.coordinator.methods_config import FlickerSpec
from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.lab.simulate.flicker_device import FleetDevice
from ursa.lab.simulate.flicker_host import FlickerHost
from ursa.lab.simulate.flicker_run import run_flicker
from ursa.lab.simulate.flicker_tables import get_table
from ursa.protocol.envelope import decode

pytest.importorskip("tenseal")

FEDERATION = "flk"
ROWS = [*get_table("D1"), (40, 80, 900, 2000), (300, 20, 100, 900)]
LIVE = {f"dev{i:03d}": tuple(row) for i, row in enumerate(ROWS)}
SILENT = "dev006"
ORDER = ("dev000", "dev001", "dev002", SILENT, "dev003", "dev004", "dev005")
TIMEOUT_S = 120.0


class Capture:
    """Every (topic, payload) the observer saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, bytes]] = []

    def __call__(self, topic: str, payload: bytes) -> None:
        with self.lock:
            self.items.append((topic, payload))

    def snapshot(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return list(self.items)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[..., FlickerHost]]:
    """A `FlickerHost` per call (its store in ``tmp_path``), closed after."""
    made: list[FlickerHost] = []

    def make(
        spec: FlickerSpec,
        devices: dict[str, DevicePublicIdentity],
        transport: Any,
        rng: np.random.Generator | None = None,
    ) -> FlickerHost:
        owner = CkksKeyOwner()

        def build(ctx: MethodContext) -> FlickerMethod:
            return FlickerMethod(spec, ctx, num_classes=4, rng=rng, key_owner=owner)

        state_dir = tmp_path / f"coordinator-{len(made)}"
        host = FlickerHost(
            FEDERATION,
            build,
            devices,
            transport,
            state_dir=state_dir,
            clock=time.monotonic,
        )
        made.append(host)
        return host

    yield make
    for host in made:
        host.close()


def encodings(counts: tuple[int, ...]) -> list[bytes]:
    """Ways a count vector could travel in plaintext."""
    values = list(counts)
    texts = [
        json.dumps(values),
        ",".join(map(str, values)),
        ", ".join(map(str, values)),
        " ".join(map(str, values)),
        str(tuple(values)),
        str(np.asarray(values)),
    ]
    return [
        msgpack.packb(values),
        msgpack.packb([float(v) for v in values]),
        np.asarray(values, dtype=np.float64).tobytes(),
        np.asarray(values, dtype=np.int64).tobytes(),
        np.asarray(values, dtype=np.int32).tobytes(),
        np.asarray(values, dtype=np.float32).tobytes(),
        *(t.encode() for t in texts),
    ]


@pytest.mark.integration
def test_flicker_runs_over_mosquitto_without_counts_in_transit(
    mosquitto_factory: Callable[..., Any],
    connect_mqtt: Callable[..., Any],
    hosts: Callable[..., FlickerHost],
) -> None:
    broker = mosquitto_factory()
    capture = Capture()
    connect_mqtt(broker, "observer", subscriptions=["#"], handler=capture)
    identities = {d: DeviceIdentity.generate(d) for d in ORDER}
    public = {d: i.public() for d, i in identities.items()}
    spec = FlickerSpec(hop_deadline_s=5.0, reply_deadline_s=60)
    coordinator = hosts(
        spec, public, connect_mqtt(broker, "coordinator"), np.random.default_rng(0)
    )
    coordinator.attach()
    participants = {}
    for device, counts in LIVE.items():
        participant = FleetDevice(
            identity=identities[device],
            federation=FEDERATION,
            peers=public,
            counts=counts,
            transport=connect_mqtt(broker, device),
            coordinator=coordinator.identity.public(),
        )
        participant.attach()
        participants[device] = participant

    coordinator.start(ORDER)
    deadline = time.monotonic() + TIMEOUT_S
    while coordinator.phase not in (FlickerPhase.DONE, FlickerPhase.FAILED):
        assert time.monotonic() < deadline, f"stuck in {coordinator.phase}"
        coordinator.tick()
        time.sleep(0.05)
    outcome = coordinator.outcome()

    # the whole protocol ran, around the silent device
    assert outcome.phase is FlickerPhase.DONE, outcome.failure
    assert outcome.skipped == (SILENT,)
    assert outcome.contributors == tuple(d for d in ORDER if d != SILENT)
    assert outcome.gd_before == tuple(int(c) for c in np.sum(list(LIVE.values()), 0))
    assert outcome.state is not None and outcome.state.updates >= 1
    finals = {d: p.counts for d, p in participants.items()}
    total = np.sum(list(finals.values()), axis=0)
    assert outcome.state.global_counts == tuple(int(c) for c in total)
    reference = run_flicker(LIVE, {d: dev.CountResampler() for d in LIVE})
    assert finals == {d: s.counts for d, s in reference.final.items()}
    assert coordinator.rejections == []
    assert all(p.rejections == [] for p in participants.values())

    # what a device downloads: the public context, under 0.5 MB
    for participant in participants.values():
        assert participant.context_bytes == coordinator.public_context_bytes
        assert participant.context_bytes <= 500_000

    # what the observer on `#` saw: sealed hops, no plaintext counts anywhere
    time.sleep(0.2)
    traffic = capture.snapshot()
    kinds = [(topic, decode(payload).kind) for topic, payload in traffic]
    hops = [t for t, k in kinds if k == "ring_hop"]
    assert any("/up/" in t for t in hops) and any("/down/" in t for t in hops)
    assert sum("/up/" in t for t in hops) == len(LIVE)  # 5 hops + 1 re-seal
    header = b"UCK\x01" + coordinator.key_owner.key_id
    for (_, kind), (_, payload) in zip(kinds, traffic, strict=True):
        if kind == "ring_hop":
            assert header not in payload  # partial sums travel sealed only
    vectors = {p.state.initial_counts for p in participants.values()}
    vectors |= set(finals.values())
    for counts in vectors:
        planted = msgpack.packb({"counts": list(counts)})  # the check can fail
        assert any(needle in planted for needle in encodings(counts))
        for needle in encodings(counts):
            leaks = [t for t, payload in traffic if needle in payload]
            assert leaks == [], (counts, needle, leaks[:3])


@pytest.mark.integration
def test_the_global_redundancy_test_runs_over_mosquitto_with_sealed_candidates(
    mosquitto_factory: Callable[..., Any],
    connect_mqtt: Callable[..., Any],
    hosts: Callable[..., FlickerHost],
) -> None:
    from ursa.edge_sdk.methods.flicker import resampling as rs
    from ursa.lab.simulate.flicker_fleet import build_fleet
    from ursa.lab.simulate.flicker_train import _digits_setup

    setup = _digits_setup("D3", 0)  # 4 devices holding digits 0-3 as Table 1, D3
    names = {d: f"dev{i:03d}" for i, d in enumerate(setup.device_x)}

    def resamplers() -> dict[str, rs.DataResampler]:
        return {
            names[d]: rs.DataResampler(
                rs.TrainingView.of(x, setup.device_y[d], 4),
                setup.extractor,
                np.random.default_rng(i),
            )
            for i, (d, x) in enumerate(setup.device_x.items())
        }

    wire, reference = resamplers(), resamplers()
    counts = {d: tuple(int(c) for c in r.view.counts()) for d, r in wire.items()}
    with build_fleet(counts, resamplers=reference) as fleet:
        fleet.run()  # the in-memory bus

    broker = mosquitto_factory()
    capture = Capture()
    connect_mqtt(broker, "observer", subscriptions=["#"], handler=capture)
    identities = {d: DeviceIdentity.generate(d) for d in wire}
    public = {d: i.public() for d, i in identities.items()}
    coordinator = hosts(FlickerSpec(), public, connect_mqtt(broker, "coordinator"))
    coordinator.attach()
    participants = {}
    for device, resampler in wire.items():
        participants[device] = FleetDevice(
            identity=identities[device],
            federation=FEDERATION,
            peers=public,
            counts=counts[device],
            transport=connect_mqtt(broker, device),
            coordinator=coordinator.identity.public(),
            resampler=resampler,
        )
        participants[device].attach()

    coordinator.start()
    deadline = time.monotonic() + TIMEOUT_S
    while coordinator.phase not in (FlickerPhase.DONE, FlickerPhase.FAILED):
        assert time.monotonic() < deadline, f"stuck in {coordinator.phase}"
        coordinator.tick()
        time.sleep(0.05)
    outcome = coordinator.outcome()

    assert outcome.phase is FlickerPhase.DONE, outcome.failure
    tests = [e for e in outcome.log if "redundancy" in e]
    assert tests and all(len(e["peers"]) == 3 and not e["silent"] for e in tests)
    for device, resampler in wire.items():  # the same removals as in memory
        assert np.array_equal(resampler.view.kept, reference[device].view.kept)
    assert coordinator.rejections == []
    assert all(p.rejections == [] for p in participants.values())

    # the candidates travel sealed; the products are ciphertexts the check can see
    time.sleep(0.2)
    header = b"UCK\x01" + coordinator.key_owner.key_id
    seen: dict[str, list[bool]] = {}
    for _, payload in capture.snapshot():
        kind = decode(payload).kind
        seen.setdefault(kind, []).append(header in payload)
    assert not any(seen["redundancy_offer"]) and not any(seen["redundancy_ask"])
    assert all(seen["redundancy_reply"])
