"""A FLICKER fleet in one process: the production protocol over an in-memory bus.

`build_fleet` connects the coordinator's production `FlickerMethod` (on a
`FlickerHost`: the runtime's store, signing point, router and refusals,
`ursa.lab.simulate.flicker_host`) and a `FleetDevice`
(`ursa.lab.simulate.flicker_device`: the device's `FlickerParticipant` on
its own transport) per device to a synchronous `InMemoryBus` (every message
is encoded, routed by topic and decoded, exactly as over MQTT; the ring
start is signed and carries the members' keys, which the devices check).
Devices listed as ``silent`` are enrolled and placed in the ring but never
connect. `Fleet.run` starts a ring and advances a fake clock past each
deadline until the run ends, so a silent device is skipped without waiting.
Devices given a `ursa.edge_sdk.methods.flicker.resampling.DataResampler` run
the global redundancy test over the bus too (``global_test=False``: the
local test only). A fleet holds a store in a temporary directory:
`Fleet.close` (or ``with``) removes it. Used by tests and
`ursa bench flicker`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import numpy as np

from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods.flicker.outcome import FlickerOutcome, FlickerPhase
from ursa.coordinator.methods_config import FlickerSpec
from ursa.crypto.ckks import CkksKeyOwner
from ursa.crypto.identity import DeviceIdentity
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.lab.simulate.fake_clock import FakeClock
from ursa.lab.simulate.flicker_device import FleetDevice
from ursa.lab.simulate.flicker_host import FlickerHost
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import COORDINATOR

__all__ = ["FakeClock", "Fleet", "build_fleet"]

FEDERATION = "flicker"
MAX_TICKS = 10_000


@dataclass
class Fleet:
    """A coordinator and its devices on one in-memory bus."""

    bus: InMemoryBus
    clock: FakeClock
    coordinator: FlickerHost
    coordinator_transport: InMemoryTransport
    participants: dict[str, FleetDevice]
    transports: dict[str, InMemoryTransport]
    state_dir: Path

    def close(self) -> None:
        """Close the coordinator's store and remove its directory."""
        self.coordinator.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def run(self, order: Sequence[str] | None = None) -> FlickerOutcome:
        """Start a ring and drive deadlines until the run is done or failed."""
        self.coordinator.start(order)
        step = max(
            self.coordinator.config.hop_deadline_s,
            self.coordinator.config.reply_deadline_s,
        )
        for _ in range(MAX_TICKS):
            if self.coordinator.phase in (FlickerPhase.DONE, FlickerPhase.FAILED):
                break
            self.clock.advance(step)
            self.coordinator.tick()
        return self.coordinator.outcome()


def build_fleet(
    counts: Mapping[str, Sequence[int]],
    *,
    silent: Collection[str] = (),
    resamplers: Mapping[str, dev.Resampler] | None = None,
    spec: FlickerSpec | None = None,
    key_owner: CkksKeyOwner | None = None,
    seed: int = 0,
    global_test: bool = True,
) -> Fleet:
    """Connect a coordinator, one participant per device in ``counts``, and ``silent``.

    ``silent`` devices need no counts; they are enrolled but never connect.
    ``spec`` is the coordinator's ``kind = "flicker"`` table (the paper's
    thresholds by default).
    """
    ids = [*counts, *(d for d in silent if d not in counts)]
    identities = {d: DeviceIdentity.generate(d) for d in ids}
    public = {d: i.public() for d, i in identities.items()}
    num_classes = len(next(iter(counts.values())))
    rng = np.random.default_rng(seed)
    owner = key_owner or CkksKeyOwner()

    def build(ctx: MethodContext) -> FlickerMethod:
        return FlickerMethod(
            spec or FlickerSpec(),
            ctx,
            num_classes=num_classes,
            rng=rng,
            key_owner=owner,
        )

    bus, clock = InMemoryBus(synchronous=True), FakeClock()
    state_dir = Path(tempfile.mkdtemp(prefix="ursa-flicker-"))
    coordinator_transport = InMemoryTransport(bus, COORDINATOR)
    coordinator = FlickerHost(
        FEDERATION,
        build,
        public,
        coordinator_transport,
        state_dir=state_dir,
        clock=clock,
    )
    config = coordinator.config
    coordinator_transport.connect()
    coordinator.attach()
    participants, transports = {}, {}
    for device, row in counts.items():
        if device in silent:
            continue
        transport = InMemoryTransport(bus, device)
        participant = FleetDevice(
            identity=identities[device],
            federation=config.federation,
            peers=public,
            coordinator=coordinator.identity.public(),
            counts=row,
            transport=transport,
            resampler=(resamplers or {}).get(device),
            rng=np.random.default_rng(rng.integers(1 << 32)),
            global_test=global_test,
        )
        transport.connect()
        participant.attach()
        participants[device], transports[device] = participant, transport
    return Fleet(
        bus,
        clock,
        coordinator,
        coordinator_transport,
        participants,
        transports,
        state_dir,
    )
