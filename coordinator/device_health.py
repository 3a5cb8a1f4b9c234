"""Which devices an operator must look at: failing their rounds, or sitting out.

Read from what the coordinator already keeps in its store's meta table: the
failure streaks (`ursa.coordinator.training_health`, ``training_health``) and
the key epoch sit-outs with their reasons (`ursa.coordinator.ready_devices`,
``sat_out`` and ``sat_out_why``: a model that does not fit the signed spec,
labels outside the classes, too many failed rounds, too many refusals).
``ursa coordinator status``, the dashboard (``/api/status``) and
``/metrics`` show the same `DeviceHealth`, whether the coordinator runs or
not. Pure: it is handed a meta getter; malformed values read as none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ursa.coordinator.ready_devices import SAT_OUT_KEY, SAT_OUT_WHY_KEY
from ursa.coordinator.training_health import HEALTH_KEY, TrainingHealth

__all__ = ["DeviceHealth", "device_health"]

logger = logging.getLogger("ursa.coordinator")


@dataclass(frozen=True)
class DeviceHealth:
    """The devices in trouble now.

    Attributes:
        failing: Devices that failed two or more selected rounds in a row:
            how many.
        sitting_out: Devices sitting the current key epoch out: why (the
            device's words escaped, or the coordinator's).
    """

    failing: Mapping[str, int] = field(default_factory=dict)
    sitting_out: Mapping[str, str] = field(default_factory=dict)


def device_health(meta: Callable[[str], str | None], epoch: int) -> DeviceHealth:
    """The `DeviceHealth` of key epoch ``epoch`` from the store's meta values."""
    health = TrainingHealth(sit_out_after=0)
    health.restore(meta(HEALTH_KEY))
    failing = {device: streak.count for device, streak in health.failing().items()}
    try:
        sat_out = json.loads(meta(SAT_OUT_KEY) or "{}")
        why = json.loads(meta(SAT_OUT_WHY_KEY) or "{}")
        sitting_out = {
            str(device): str(why.get(device, ""))
            for device, sat in sorted(sat_out.items())
            if int(sat) == epoch
        }
    except (ValueError, TypeError, AttributeError) as exc:
        logger.warning("stored sit-outs unreadable (%s)", exc)
        sitting_out = {}
    return DeviceHealth(failing, sitting_out)
