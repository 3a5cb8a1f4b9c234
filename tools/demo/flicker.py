"""`ursa demo --methods ...,flicker`: the device processes' settings, the report.

FLICKER runs inside the demo's one federation: the coordinator service runs
it between enrolment and the first key epoch
(`ursa.coordinator.methods.flicker`), and each device process's `EdgeClient`
takes part with a `Flicker` over its own images, on its one MQTT session.
This module carries the shared feature extractor to the processes
(`CentroidFeatures` fit on the harness's auxiliary data, the held-out split's
class means: the stand-in for the paper's pre-shared network; the test
split's samples themselves never reach a device) and assembles the report's
``flicker`` section from the coordinator's summary and the devices' figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ursa.edge_sdk.client import EdgeClient
    from ursa.edge_sdk.method import MethodFactory
    from ursa.tools.demo.fleet import DeviceSpec

__all__ = ["device_figures", "device_flicker", "flicker_extra", "summarise"]


def flicker_extra(
    aux_x: np.ndarray[Any, Any], aux_y: np.ndarray[Any, Any], num_classes: int
) -> dict[str, Any]:
    """The picklable FLICKER settings a device process gets (in `FleetSpec.extra`)."""
    from ursa.edge_sdk.methods.flicker.resampling import CentroidFeatures

    side = round(float(np.sqrt(aux_x[0].size)))
    if side * side != aux_x[0].size:
        raise ValueError(f"samples of {aux_x[0].size} values are not square images")
    extractor = CentroidFeatures.fit(aux_x.reshape(-1, side, side), aux_y, num_classes)
    return {
        "centroids": extractor.centroids,
        "temperature": extractor.temperature,
        "num_classes": num_classes,
    }


def device_flicker(extra: Mapping[str, Any], device: DeviceSpec) -> MethodFactory:
    """The factory of a device's `Flicker` over its images with the shared extractor."""
    from ursa.edge_sdk.methods.flicker.method import Flicker
    from ursa.edge_sdk.methods.flicker.resampling import CentroidFeatures
    from ursa.edge_sdk.methods_config import FlickerDeviceSpec

    spec = FlickerDeviceSpec(num_classes=int(extra["num_classes"]))
    extractor = CentroidFeatures(extra["centroids"], extra["temperature"])
    rng = np.random.default_rng([device.seed, 4])
    return lambda ctx: Flicker(
        ctx, spec, labels=device.y, x=device.x, extractor=extractor, rng=rng
    )


def device_figures(client: EdgeClient) -> dict[str, Any] | None:
    """A device's FLICKER figures (its own counts stay in its process's report)."""
    from ursa.edge_sdk.methods.flicker.method import Flicker

    try:
        participant = client.method(Flicker).participant
    except KeyError:  # the device runs no FLICKER
        return None
    state = participant.state
    return {
        "counts_before": [int(c) for c in state.initial_counts],
        "counts_after": [int(c) for c in participant.counts],
        "added": state.added,
        "removed": state.removed,
        "steps": len(participant.steps),
        "saturation": None if state.saturation is None else str(state.saturation),
    }


def summarise(section: dict[str, Any], figures: Mapping[str, Any]) -> dict[str, Any]:
    """The ``flicker`` section with the devices' figures merged in."""
    rows = dict(sorted(figures.items()))
    section = dict(section)
    section["devices"] = rows
    section["samples_added"] = sum(int(r["added"]) for r in rows.values())
    section["samples_removed"] = sum(int(r["removed"]) for r in rows.values())
    return section
