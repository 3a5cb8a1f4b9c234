"""Who the coordinator can count on: online, enrolled, not refusing us; and sit-outs.

A key epoch needs its quorum of such devices, a round draws from them, and a
device that sat the key epoch out (``method_mismatch``, ``data_mismatch``,
too many refusals) is left out of what methods see (`OnlineDevices`). The
set is kept per device event (`touch`, O(1)), never rebuilt per message;
the sit-outs are persisted for a restart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Set

from ursa.coordinator.device_sets import OnlineDevices
from ursa.coordinator.enrolled_devices import EnrolledDevices
from ursa.coordinator.presence import Presence
from ursa.coordinator.store_slot import StoreSlot
from ursa.protocol.untrusted_text import escape

__all__ = ["SAT_OUT_KEY", "SAT_OUT_WHY_KEY", "ReadyDevices"]

SAT_OUT_KEY = "sat_out"
"""Store meta key: JSON ``{device: key epoch}`` of the devices that sat out."""
SAT_OUT_WHY_KEY = "sat_out_why"
"""Store meta key: JSON ``{device: why}``, the reason of each one's last sit-out
(a device's own words escaped, at most `MAX_WHY_CHARS`), for the status."""
MAX_WHY_CHARS = 300


class ReadyDevices:
    """The ready set, the sit-outs and the read-only view methods get.

    Args:
        devices: The enrolled devices (and who refuses us).
        presence: Who is online.
        epoch: The current key epoch's number.
    """

    def __init__(
        self,
        *,
        devices: EnrolledDevices,
        presence: Presence,
        epoch: Callable[[], int],
        store: StoreSlot,
    ) -> None:
        self._devices = devices
        self._presence = presence
        self._epoch = epoch
        self._ready: set[str] = set()
        self._sat_out: dict[str, int] = {}
        self._why: dict[str, str] = {}
        self.view = OnlineDevices(self._ready, lambda: self._sat_out, epoch)
        """`ready` without the devices sitting the key epoch out (read-only)."""
        self._store = store

    @property
    def ready(self) -> Set[str]:
        """Online enrolled devices not refusing us (maintained: O(1) to get)."""
        return self._ready

    def touch(self, device: str) -> None:
        """Bring `device`'s membership up to date (O(1))."""
        self.view.touch(device)
        if (
            device in self._presence.online
            and device in self._devices.identities
            and device not in self._devices.refusing
        ):
            self._ready.add(device)
        else:
            self._ready.discard(device)

    def restore(self) -> None:
        """Reload the sit-outs and recompute the set (start-up only: O(N))."""
        sat_out = json.loads(self._store.store.get_meta(SAT_OUT_KEY) or "{}")
        self._sat_out = {str(d): int(e) for d, e in sat_out.items()}
        why = json.loads(self._store.store.get_meta(SAT_OUT_WHY_KEY) or "{}")
        self._why = {str(d): str(w) for d, w in why.items()}
        devices, online = self._devices, self._presence.online
        self._ready.clear()  # in place: the view shares it
        self._ready.update(
            d for d in online if d in devices.identities and d not in devices.refusing
        )
        self.view.forget()

    def sat_out_of(self, device: str) -> int | None:
        """The key epoch `device` last sat out, if any."""
        return self._sat_out.get(device)

    def sitting_out(self) -> set[str]:
        """Devices that told us they sit the current key epoch out."""
        epoch = self._epoch()
        return {device for device, e in self._sat_out.items() if e == epoch}

    def sit_out(self, device: str, why: str = "") -> None:
        """Leave `device` out of the current key epoch (persisted for a restart).

        ``why`` (a device's words are escaped here) is shown by the status.
        """
        self._sat_out[device] = self._epoch()
        self._why[device] = escape(why, MAX_WHY_CHARS)
        self.view.touch(device)
        self._store.store.set_meta(SAT_OUT_KEY, json.dumps(self._sat_out))
        self._store.store.set_meta(SAT_OUT_WHY_KEY, json.dumps(self._why))
