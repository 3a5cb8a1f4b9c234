"""CLIMB's dual steps in one process: the production step and devices over a bus.

`ClimbFleet` connects the coordinator's production `ClimbDualStep` (on a
`StepHost`: the runtime's store, signing point, router and refusals,
`ursa.lab.simulate.step_host`) and one `ClimbDevice` per device (the
device's production `Climb` and `SecureMeans`, `ursa.lab.simulate.climb_device`)
to a synchronous `InMemoryBus`: every message is encoded, signed by the
coordinator where devices check, routed by topic and decoded, exactly as over
MQTT. The key epoch is one real Paillier key pair (at the run's key size)
whose public half the coordinator holds and whose secret half every device
is handed (the agent's sealed key, which a real fleet sends, is left out).

`dual_step` publishes a global version and plays the round's step: the
`MeanRequest` to all, every device's ``Enc([f_i, lambda_i])``, the
`MeanSum`, the devices' own dual updates; then `weights` are the ``w_i`` the
selected devices scale their deltas by. A fleet holds its stores in a
temporary directory: `close` removes it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ursa.coordinator.before_training import RoundInfo
from ursa.coordinator.enrolment import device_keys_of
from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods_config import ClimbSpec
from ursa.coordinator.plugin import EpochView
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.paillier import generate_keypair
from ursa.edge_sdk.method import EpochKeys
from ursa.edge_sdk.methods.climb.dual import ClimbConfig
from ursa.lab.simulate.climb_device import ClimbDevice
from ursa.lab.simulate.flicker_fleet import FakeClock
from ursa.lab.simulate.step_host import StepHost
from ursa.models.weights import Arrays
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import COORDINATOR, KeyEpochStart
from ursa.tools.data.federation import DeviceData

__all__ = ["ClimbFleet", "device_id"]

FEDERATION = "climb"
MODEL = "mlp"
EPOCH = 1
MAX_TICKS = 100


def device_id(index: int) -> str:
    """Device ``index``'s id in a simulated federation."""
    return f"dev{index:05d}"


class ClimbFleet:
    """A hosted `ClimbDualStep` and a `ClimbDevice` per device (module docstring).

    Args:
        devices: Each device's local data (device i is `device_id` (i)).
        config: CLIMB's device constants.
        dual_period: Rounds per dual step (the coordinator's ``dual_period``).
        key_bits: The Paillier key size (512 is enough for tests).
        num_classes: The classes of the federation (the key epoch's).
    """

    def __init__(
        self,
        devices: Sequence[DeviceData],
        config: ClimbConfig,
        *,
        dual_period: int,
        key_bits: int,
        num_classes: int,
    ) -> None:
        self.ids = [device_id(i) for i in range(len(devices))]
        self.spec = ClimbSpec(dual_period=dual_period, max_parties=config.max_parties)
        self.clock = FakeClock()
        self._dir = Path(tempfile.mkdtemp(prefix="ursa-climb-"))
        self._models: dict[int, Arrays] = {}
        identities = {d: DeviceIdentity.generate(d) for d in self.ids}
        public_ids = {d: i.public() for d, i in identities.items()}
        public, secret = generate_keypair(key_bits)
        self.bus = InMemoryBus(synchronous=True)
        transport = InMemoryTransport(self.bus, COORDINATOR)
        self.host = StepHost(
            FEDERATION,
            ClimbDualStep.later(self.spec),
            epoch=EpochView(EPOCH, public, frozenset(self.ids), self.ids[0]),
            devices=public_ids,
            transport=transport,
            state_dir=self._dir,
            clock=self.clock,
        )
        transport.connect()
        self.host.attach()
        notice = self.host.sign(
            KeyEpochStart(
                federation=FEDERATION,
                round=0,
                sender=COORDINATOR,
                epoch=EPOCH,
                agent=self.ids[0],
                agent_keys=device_keys_of(public_ids[self.ids[0]]),
                num_classes=num_classes,
                groups=(num_classes,),
                sigma=(0.0,),
                max_parties=config.max_parties,
                key_bits=public.key_bits,
                methods=(ClimbDualStep.name,),
            )
        )
        keys = EpochKeys(notice, public, secret, None)
        self.devices: list[ClimbDevice] = []
        for device, data in zip(self.ids, devices, strict=True):
            link = InMemoryTransport(self.bus, device)
            member = ClimbDevice(
                device,
                FEDERATION,
                data,
                config,
                keys=keys,
                coordinator=self.host.identity.public(),
                models=self._models,
                state_dir=self._dir / device,
                transport=link,
            )
            link.connect()
            member.attach()
            self.devices.append(member)

    # --- what the simulation reads --------------------------------------------

    @property
    def weights(self) -> npt.NDArray[np.float64]:
        """Every device's ``w_i`` (device order)."""
        return np.array([d.weight for d in self.devices])

    @property
    def lambdas(self) -> npt.NDArray[np.float64]:
        """Every device's ``lambda_i`` (device order)."""
        return np.array([d.lam for d in self.devices])

    @property
    def rejections(self) -> list[tuple[str, str]]:
        """What the devices and the coordinator refused ((kind, reason))."""
        refused = [(r.kind, r.reason) for r in self.host.rejections]
        return refused + [r for d in self.devices for r in d.rejections]

    # --- driving it -------------------------------------------------------------

    def dual_step(
        self, round_index: int, arrays: Arrays, selected: Sequence[str] = ()
    ) -> bool:
        """Publish ``arrays`` as round ``round_index``'s version; play its step.

        Returns:
            Whether the round had a dual step (the step's ``dual_period``).

        Raises:
            RuntimeError: the step did not close within `MAX_TICKS` deadlines.
        """
        self._models.clear()  # a device reads only the round's version
        self._models[round_index] = arrays
        info = RoundInfo(round_index, MODEL, round_index, tuple(selected))
        host = self.host
        if not host.open(info):
            return False
        for _ in range(MAX_TICKS):
            if host.is_done(round_index):
                break
            self.clock.advance(self.spec.dual_timeout_s)
            host.tick(round_index)
        else:
            raise RuntimeError(f"round {round_index}: the dual step never closed")
        host.close_round(round_index)
        return True

    def close(self) -> None:
        """Close the coordinator's store and remove the fleet's directory."""
        self.host.close()
        self.bus.close()
        shutil.rmtree(self._dir, ignore_errors=True)
