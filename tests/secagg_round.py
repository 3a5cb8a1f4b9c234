"""A whole secure-aggregation round in memory, every exchanged item through bytes.

Devices are `MaskingParticipant`s; the "coordinator" is this module's routing
plus `add_masked` / `unmask_sum`. Dropouts happen at the three points the
protocol must survive: (a) before sharing, (b) after sharing but before the
masked input, (c) after the masked input but before unmasking.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ursa.coordinator.secure_aggregation import add_masked, unmask_sum
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.neighbour_graph import graph_seed, neighbours
from ursa.crypto.shamir import UnmaskShare
from ursa.edge_sdk.secure_aggregation import KeyAdvert, MaskingParticipant, PeerAdvert

FEDERATION = "fed-1"
RUN = "run-1"
ROUND = 3

Reveals = dict[str, list[UnmaskShare]]


def device_ids(k: int) -> list[str]:
    return [f"dev-{i:02d}" for i in range(k)]


@dataclass
class Round:
    """The devices of one round and what the coordinator has seen so far."""

    k: int
    threshold: int
    degree: int
    round_index: int = ROUND
    identities: dict[str, DeviceIdentity] = field(default_factory=dict)
    devices: dict[str, MaskingParticipant] = field(default_factory=dict)
    adverts: dict[str, bytes] = field(default_factory=dict)
    inbox: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)
    shared: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for device_id in device_ids(self.k):
            identity = DeviceIdentity.generate(device_id)
            self.identities[device_id] = identity
            self.devices[device_id] = MaskingParticipant(
                identity=identity,
                federation=FEDERATION,
                run=RUN,
                round_index=self.round_index,
                threshold=self.threshold,
                degree=self.degree,
            )

    @property
    def participants(self) -> list[str]:
        return sorted(self.devices)

    def graph(self) -> dict[str, tuple[str, ...]]:
        seed = graph_seed(FEDERATION, RUN, self.round_index)
        return neighbours(self.participants, self.degree, seed)

    def advertise(self) -> None:
        """SA1: every device's advert, as bytes."""
        for device_id, device in self.devices.items():
            self.adverts[device_id] = device.advertise().to_bytes()

    def roster(self, device_id: str) -> list[PeerAdvert]:
        """SA1 result for one device: its neighbours' adverts, through bytes."""
        return [
            PeerAdvert.from_bytes(
                PeerAdvert.of(
                    self.identities[peer].public(),
                    KeyAdvert.from_bytes(self.adverts[peer]),
                ).to_bytes()
            )
            for peer in self.graph()[device_id]
        ]

    def share(self, dropped: Collection[str] = ()) -> None:
        """SA2: every device but ``dropped`` seals its boxes; the coordinator routes."""
        self.inbox = defaultdict(list)
        self.shared = []
        for device_id, device in sorted(self.devices.items()):
            if device_id in dropped:
                continue
            boxes = device.share(self.roster(device_id), self.participants)
            self.shared.append(device_id)
            for recipient, box in boxes:
                self.inbox[recipient].append((device_id, bytes(box)))

    def deliver(self) -> None:
        """SA2 result: each device in U2 gets the boxes its U2 neighbours sent."""
        for device_id in self.shared:
            self.devices[device_id].receive_shares(self.inbox[device_id])

    def mask(
        self, vectors: Mapping[str, NDArray[np.uint32]], dropped: Collection[str] = ()
    ) -> tuple[NDArray[np.uint32], list[str]]:
        """TRAIN: the masked inputs of U2 minus ``dropped``, summed."""
        length = len(next(iter(vectors.values())))
        total = np.zeros(length, dtype=np.uint32)
        counted = []
        for device_id in self.shared:
            if device_id in dropped:
                continue
            masked = self.devices[device_id].mask(vectors[device_id])
            wire = masked.astype("<u4").tobytes()
            total = add_masked(
                total, np.frombuffer(wire, dtype="<u4").astype(np.uint32)
            )
            counted.append(device_id)
        return total, counted

    def reveal(
        self, survivors: Sequence[str], dropped: Sequence[str], silent: Collection[str]
    ) -> Reveals:
        """SA3: the survivors but ``silent`` reveal; shares grouped by owner."""
        grouped: Reveals = defaultdict(list)
        for device_id in survivors:
            if device_id in silent:
                continue
            for item in self.devices[device_id].unmask(survivors, dropped):
                decoded = UnmaskShare.from_bytes(item.to_bytes())
                grouped[decoded.owner].append(decoded)
        return dict(grouped)

    def s_publics(self, devices: Collection[str]) -> dict[str, bytes]:
        return {
            u: KeyAdvert.from_bytes(self.adverts[u]).s_public
            for u in devices
            if u in self.adverts
        }

    def unmask(
        self,
        total: NDArray[np.uint32],
        survivors: Sequence[str],
        dropped: Sequence[str],
        reveals: Reveals,
    ) -> NDArray[np.uint32]:
        return unmask_sum(
            total,
            federation=FEDERATION,
            run=RUN,
            round_index=self.round_index,
            participants=self.participants,
            adverts=self.s_publics([*survivors, *dropped]),
            survivors=survivors,
            dropped=dropped,
            shares=reveals,
            threshold=self.threshold,
            degree=self.degree,
        )


@dataclass
class Outcome:
    total: NDArray[np.uint32]
    survivors: list[str]
    dropped: list[str]


def run_round(
    secagg: Round,
    vectors: Mapping[str, NDArray[np.uint32]],
    *,
    drop_before_share: Collection[str] = (),
    drop_before_mask: Collection[str] = (),
    drop_before_unmask: Collection[str] = (),
    tamper: Callable[[Reveals], Reveals] | None = None,
) -> Outcome:
    """Run every step; return the unmasked sum and who counted."""
    secagg.advertise()
    secagg.share(dropped=drop_before_share)
    secagg.deliver()
    total, survivors = secagg.mask(vectors, dropped=drop_before_mask)
    dropped = sorted(set(secagg.shared) - set(survivors))
    reveals = secagg.reveal(survivors, dropped, silent=drop_before_unmask)
    if tamper is not None:
        reveals = tamper(reveals)
    return Outcome(
        secagg.unmask(total, survivors, dropped, reveals), survivors, dropped
    )
