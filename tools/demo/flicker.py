"""`ursa demo --balance flicker`: FLICKER among the device processes before training.

Both sides run the real protocol (CKKS, sealed ring, masked cosines, the
global redundancy test) over MQTT, under their own federation namespace
`FLICKER_FEDERATION`, so neither the coordinator service nor the
`EdgeClient`s (which start afterwards) see a FLICKER message:

* harness: `provision_identities` writes each device's `DeviceIdentity` into
  its state dir (the same ``identity.key`` its `EdgeClient` loads and enrols
  with afterwards), so the ring knows every device's public identity;
  `run_coordinator_side` waits until every participant is subscribed, runs a
  `FlickerCoordinator` on its own MQTT connection until DONE/FAILED, and
  returns the JSON section (GI before/after, stop reason, wall time);
* device process: `balance_devices` runs one `FlickerParticipant` per hosted
  device, each with a `DataResampler` over its own images, until the harness
  says the run is over; it returns the devices with their *resampled training
  views* (stored arrays untouched) and per-device figures.

The shared feature extractor is `CentroidFeatures` fit on the harness's
auxiliary data (the held-out split's class means: the stand-in for the
paper's pre-shared network; the test split's samples themselves never reach
a device).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ursa.crypto.identity import DevicePublicIdentity
    from ursa.protocol.mqtt import MqttTransport
    from ursa.tools.demo.fleet import DeviceSpec, FleetSpec

__all__ = [
    "FLICKER_FEDERATION",
    "balance_devices",
    "flicker_extra",
    "provision_identities",
    "run_coordinator_side",
]

logger = logging.getLogger("ursa.demo")

FLICKER_FEDERATION = "demo-flicker"
TICK_S = 0.1
READY_TIMEOUT_S = 120.0
COORDINATOR_CLIENT = "coordinator-flicker"


def provision_identities(
    state_root: Path, device_ids: Sequence[str]
) -> dict[str, DevicePublicIdentity]:
    """Create each device's identity in its state dir; return the public halves."""
    from ursa.crypto.identity import DeviceIdentity

    out = {}
    for device in device_ids:
        state_dir = state_root / device
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        out[device] = DeviceIdentity.load_or_create(state_dir, device).public()
    return out


def flicker_extra(
    public: Mapping[str, DevicePublicIdentity],
    aux_x: np.ndarray[Any, Any],
    aux_y: np.ndarray[Any, Any],
    num_classes: int,
) -> dict[str, Any]:
    """The picklable FLICKER settings a device process gets (in `FleetSpec.extra`)."""
    from ursa.edge_sdk.methods.flicker.resampling import CentroidFeatures

    side = round(float(np.sqrt(aux_x[0].size)))
    if side * side != aux_x[0].size:
        raise ValueError(f"samples of {aux_x[0].size} values are not square images")
    extractor = CentroidFeatures.fit(aux_x.reshape(-1, side, side), aux_y, num_classes)
    return {
        "image_shape": (side, side),
        "peers": {d: p.to_bytes() for d, p in public.items()},
        "centroids": extractor.centroids,
        "temperature": extractor.temperature,
        "num_classes": num_classes,
    }


def _transport(url: str, client_id: str) -> MqttTransport:
    from ursa.protocol.broker_config import BrokerConfig
    from ursa.protocol.mqtt import MqttTransport

    return MqttTransport(BrokerConfig(url=url).mqtt_config(client_id))


def run_coordinator_side(
    url: str,
    public: Mapping[str, DevicePublicIdentity],
    num_classes: int,
    ready: Any,
    *,
    seed: int,
    timeout_s: float,
    alive: Callable[[], bool] = lambda: True,
) -> dict[str, Any]:
    """Run FLICKER once every device is ready; the report's ``flicker`` section.

    ``ready`` is the queue on which each device process puts its device ids;
    ``alive`` says whether every device process still runs.
    """
    from ursa.coordinator.methods.flicker.algorithm import global_imbalance
    from ursa.coordinator.methods.flicker.engine import (
        FlickerCoordinator,
        FlickerServiceConfig,
        Phase,
    )

    started = time.perf_counter()
    waiting, deadline = set(public), time.monotonic() + READY_TIMEOUT_S
    while waiting and time.monotonic() < deadline and alive():
        try:
            waiting.discard(ready.get(timeout=1.0))
        except queue.Empty:
            continue
    if waiting:
        failure = f"devices not ready: {sorted(waiting)}"
        return {"phase": "failed", "failure": failure, "wall_s": 0.0}
    transport = _transport(url, COORDINATOR_CLIENT)
    transport.connect()
    try:
        config = FlickerServiceConfig(
            federation=FLICKER_FEDERATION, num_classes=num_classes
        )
        coordinator = FlickerCoordinator(
            config, public, transport, rng=np.random.default_rng([seed, 7])
        )
        coordinator.attach()
        coordinator.start()
        deadline = time.monotonic() + timeout_s
        while coordinator.phase not in (Phase.DONE, Phase.FAILED):
            if time.monotonic() > deadline:
                break
            coordinator.tick()
            time.sleep(TICK_S)
        outcome = coordinator.outcome()
    finally:
        transport.close()
    state = outcome.state
    before = outcome.gd_before
    return {
        "phase": str(outcome.phase),
        "failure": outcome.failure
        or (None if outcome.phase is Phase.DONE else "timed out"),
        "ring_order": list(outcome.ring_order),
        "skipped": list(outcome.skipped),
        "global_counts_before": None if before is None else list(before),
        "global_counts_after": None if state is None else list(state.global_counts),
        "gi_before": None if before is None else float(global_imbalance(before)),
        "gi_after": None if state is None else float(state.gi),
        "nabla": config.nabla,
        "stop_reason": None
        if state is None or state.stop_reason is None
        else str(state.stop_reason),
        "updates": None if state is None else state.updates,
        "context_bytes": coordinator.public_context_bytes,
        "rejections": len(coordinator.rejections),
        "wall_s": time.perf_counter() - started,
    }


def balance_devices(
    spec: FleetSpec, ready: Any, done: Any, connect_lock: Any, timeout_s: float
) -> tuple[tuple[DeviceSpec, ...], dict[str, dict[str, Any]]]:
    """Take part in FLICKER; return the devices on their resampled views.

    Puts each device id on ``ready`` once subscribed and waits for ``done``
    (a multiprocessing Event the harness sets when the run is over).
    """
    from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
    from ursa.edge_sdk.methods.flicker.participant import FlickerParticipant
    from ursa.edge_sdk.methods.flicker.resampling import (
        CentroidFeatures,
        DataResampler,
        TrainingView,
    )

    extra = spec.extra["flicker"]
    peers = {d: DevicePublicIdentity.from_bytes(b) for d, b in extra["peers"].items()}
    extractor = CentroidFeatures(extra["centroids"], extra["temperature"])
    num_classes = int(extra["num_classes"])
    parts: list[tuple[DeviceSpec, DataResampler, FlickerParticipant]] = []
    transports = []
    try:
        for device in spec.devices:
            identity = DeviceIdentity.load_or_create(
                spec.state_root / device.device_id, device.device_id
            )
            images = device.x.reshape(len(device.x), *extra["image_shape"])
            view = TrainingView.of(images, device.y, num_classes)
            resampler = DataResampler(
                view, extractor, np.random.default_rng([device.seed, 3])
            )
            transport = _transport(spec.broker_url, f"{device.device_id}-flicker")
            participant = FlickerParticipant(
                identity=identity,
                federation=FLICKER_FEDERATION,
                peers=peers,
                counts=view.counts(),
                transport=transport,
                resampler=resampler,
                rng=np.random.default_rng([device.seed, 4]),
            )
            if connect_lock is None:
                transport.connect()
                participant.attach()
            else:
                with connect_lock:
                    transport.connect()
                    participant.attach()
            transports.append(transport)
            parts.append((device, resampler, participant))
            ready.put(device.device_id)
        if not done.wait(timeout_s):
            logger.warning("FLICKER: no end signal; training on the current views")
    finally:
        for transport in transports:
            transport.close()
    devices, figures = [], {}
    for device, resampler, participant in parts:
        x, y = resampler.view.materialise()
        view = resampler.view
        figures[device.device_id] = {
            "counts_before": [int(c) for c in participant.state.initial_counts],
            "counts_after": [int(c) for c in view.counts()],
            "added": len(view.extra_y),
            "removed": len(device.y) - len(view.kept),
            "steps": len(participant.steps),
            "saturation": None
            if participant.state.saturation is None
            else str(participant.state.saturation),
            "rejections": len(participant.rejections),
        }
        flat = x.reshape(len(x), *device.x.shape[1:]).astype(device.x.dtype)
        devices.append(replace(device, x=flat, y=y))
    return tuple(devices), figures


def summarise(section: dict[str, Any], figures: Mapping[str, Any]) -> dict[str, Any]:
    """The ``flicker`` section with the devices' figures merged in."""
    rows = dict(sorted(figures.items()))
    section = dict(section)
    section["devices"] = rows
    section["samples_added"] = sum(int(r["added"]) for r in rows.values())
    section["samples_removed"] = sum(int(r["removed"]) for r in rows.values())
    return section
