"""Device processes of `ursa demo`: EdgeClients with a torch trainer, own processes.

`run_device_process` is the target of a process forked from one
*forkserver* that imported torch and the SDK once (`PRELOADED`): 20 devices
then start in seconds instead of 20 cold torch imports on two cores. The
server forks before any paho thread or torch work exists, so nothing that
does not survive a fork is copied; where there is no forkserver (Windows),
the processes are spawned. It gets a picklable
`FleetSpec` (broker, model, training settings, and the devices it hosts with
their local data), runs one `EdgeClient` per device with its own MQTT
connection until the stop event is set, then puts one `DeviceReport` per
device on the result queue (crypto seconds, traffic, training counters).
The harness starts one process per device by default.
"""

from __future__ import annotations

import logging
import multiprocessing.forkserver
import multiprocessing.queues
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ursa.edge_sdk.callbacks import DeviceCallbacks, RoundTrained
from ursa.edge_sdk.federation_end import WEIGHTS_FILENAME
from ursa.tools.demo.fleet import DeviceReport, DeviceSpec, FleetSpec

if TYPE_CHECKING:
    from ursa.edge_sdk.client import EdgeClient
    from ursa.edge_sdk.methods_config import DeviceMethodSpec

__all__ = [
    "PRELOADED",
    "DeviceFleet",
    "RoundTimes",
    "peak_rss_bytes",
    "run_device_process",
    "spawn_devices",
    "start_forkserver",
]

POLL_S = 0.5
CONNECT_ATTEMPTS = 3
PRELOADED = (
    "torch",
    "torch._dynamo",  # torch 2's first optimiser step imports it: seconds a process
    "ursa.edge_sdk.client",
    "ursa.edge_sdk.training",
    "ursa.models.registry",
    "ursa.tools.compose",
    "ursa.tools.demo.devices",
    "ursa.tools.demo.flicker",
)
"""What the forkserver imports once, before it forks the device processes (a
module that cannot be imported, e.g. torch without the train extra, is skipped)."""


def run_device_process(
    spec: FleetSpec,
    stop: Any,
    results: multiprocessing.queues.Queue[DeviceReport],
    connect_lock: Any = None,
) -> None:
    """Run the spec's devices until ``stop`` (a multiprocessing Event) is set.

    ``connect_lock`` (a multiprocessing Lock shared by all device processes)
    serialises the connections: amqtt 0.12 can drop a client that connects
    while another subscribes (it iterates its subscription table across an
    await), so devices connect one at a time, and retry a failed start.

    With FLICKER (``spec.extra["flicker"]``) each client takes part in it
    before its first registration and then trains on its resampled images.
    """
    logging.basicConfig(level=spec.log_level, format="%(asctime)s %(name)s %(message)s")

    clients: list[EdgeClient] = []
    timings: dict[str, RoundTimes] = {d.device_id: RoundTimes() for d in spec.devices}
    try:
        for device in spec.devices:
            own = timings[device.device_id]
            clients.append(_start_client(spec, device, connect_lock, own))
        while not stop.wait(POLL_S):
            for client in clients:
                client.poll()
            if all(client.finished.is_set() for client in clients):
                break  # the federation is over: every final model is saved
    except Exception as exc:  # report it to the harness instead of dying silently
        logging.getLogger("ursa.demo").exception("device process failed")
        for device in spec.devices:
            results.put(_empty_report(device.device_id, repr(exc)))
        return
    finally:
        for client in clients:
            client.stop()
    from ursa.tools.demo.flicker import device_figures

    peak = peak_rss_bytes()
    for client in clients:
        results.put(
            _report(client, timings[client.device_id], peak, device_figures(client))
        )


class RoundTimes(DeviceCallbacks):
    """Each round's local training time on one device (its `RoundTrained` events)."""

    def __init__(self) -> None:
        self.train_s: dict[int, float] = {}

    def on_round_trained(self, event: RoundTrained) -> None:
        """Keep the round's training time (for `ursa bench rounds`)."""
        self.train_s[event.round] = event.train_s


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS: bytes


def _start_client(
    spec: FleetSpec, device: DeviceSpec, connect_lock: Any, callbacks: RoundTimes
) -> EdgeClient:
    """A started EdgeClient for ``device``, built as `ursa device run` builds one.

    The device's data is written to its state dir and read back by
    `ursa.tools.compose.build_device` from the ``[training]`` section, so the
    demo's devices are configured exactly as an operator's would be; only
    FLICKER's image resampling (the shared feature extractor) is built here.
    A failed connect is retried.
    """
    from ursa.edge_sdk.config import (
        BrokerConfig,
        DeviceConfig,
        DeviceTrainingConfig,
        TrustConfig,
    )
    from ursa.protocol.transport import TransportError
    from ursa.tools.compose import build_device
    from ursa.tools.demo.flicker import device_flicker

    state_dir = spec.state_root / device.device_id
    state_dir.mkdir(parents=True, exist_ok=True)
    data_file = state_dir / "data.npz"
    np.savez(data_file, x=device.x, y=device.y)
    config = DeviceConfig(
        device_id=device.device_id,
        federation=spec.federation,
        state_dir=state_dir,
        broker=BrokerConfig(url=spec.broker_url),
        obfuscator_pool_size=spec.obfuscator_pool_size,
        allow_plain_aggregation=spec.allow_plain_aggregation,
        insecure_test_keys=spec.insecure_test_keys,
        methods=_methods(spec),
        trust=spec.trust.get(device.device_id, TrustConfig()),
        training=DeviceTrainingConfig(
            data_file=str(data_file),
            architecture=spec.architecture,
            model_options=dict(spec.model_config),
            train=dict(spec.train),
            wire_dtype=spec.wire_dtype,
            seed=device.seed,
            eval_fraction=spec.eval_fraction,
        ),
    )
    extra = spec.extra.get("flicker")
    for attempt in range(CONNECT_ATTEMPTS):
        own = [] if extra is None else [device_flicker(extra, device)]
        client = build_device(
            config,
            rng=np.random.default_rng(device.seed),
            methods=own,
            callbacks=callbacks,
        )
        try:
            if connect_lock is None:
                client.start()
            else:
                with connect_lock:
                    client.start()
            return client
        except TransportError as exc:
            client.stop()
            if attempt == CONNECT_ATTEMPTS - 1:
                raise
            logging.getLogger("ursa.demo").warning(
                "%s: connect failed (%s); retrying", device.device_id, exc
            )
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


def _methods(spec: FleetSpec) -> tuple[DeviceMethodSpec, ...]:
    """The device's ``[[methods]]``: the fleet's selection, training and balancing."""
    from pydantic import TypeAdapter

    from ursa.edge_sdk.methods_config import DeviceMethodSpec

    if spec.feddisk is not None:
        training: dict[str, Any] = {"kind": "feddisk", **spec.feddisk}
    elif spec.climb is not None:
        training = {"kind": "climb", **spec.climb}
    else:
        training = {"kind": "fedavg"}
    selection: dict[str, Any] = {"kind": spec.selection}
    if spec.selection == "dubhe":
        selection["draw"] = spec.draw
    tables = [selection, training]
    if "flicker" in spec.extra:
        tables.append({"kind": "flicker"})
    adapter = TypeAdapter(tuple[DeviceMethodSpec, ...])
    return adapter.validate_python(tuple(tables))


def _report(
    client: EdgeClient,
    timings: RoundTimes,
    peak_rss: int | None,
    flicker: dict[str, Any] | None = None,
) -> DeviceReport:
    transport = client.transport
    assert transport is not None
    stats = transport.stats
    training = client.training_stats
    return DeviceReport(
        device_id=client.device_id,
        crypto_s=client.stats.crypto_s,
        bytes_sent=stats.bytes_sent,
        bytes_received=stats.bytes_received,
        messages_sent=stats.messages_sent,
        messages_received=stats.messages_received,
        train_s=training.train_s,
        rounds_trained=training.rounds_trained,
        update_bytes=training.update_bytes,
        dual_steps=training.dual_steps,
        selected_rounds=tuple(client.stats.selected_rounds),
        flicker=flicker,
        final_model_saved=client.finished.is_set()
        and (client.final_dir / WEIGHTS_FILENAME).is_file(),
        round_train_s=tuple(sorted(timings.train_s.items())),
        peak_rss_bytes=peak_rss,
    )


def _empty_report(device_id: str, error: str) -> DeviceReport:
    return DeviceReport(device_id, 0.0, 0, 0, 0, 0, 0.0, 0, 0, 0, (), error)


def wait_for_reports(
    results: multiprocessing.queues.Queue[DeviceReport],
    count: int,
    timeout_s: float,
) -> list[DeviceReport]:
    """Collect up to ``count`` reports within ``timeout_s``."""
    reports: list[DeviceReport] = []
    deadline = time.monotonic() + timeout_s
    while len(reports) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            reports.append(results.get(timeout=remaining))
        except Exception:  # queue.Empty
            break
    return reports


@dataclass
class DeviceFleet:
    """The running device processes and what they share with the harness."""

    processes: list[Any]
    stop: Any
    results: Any
    connect_lock: Any


def spawn_devices(
    specs: list[DeviceSpec], fleet: dict[str, Any], processes: int
) -> DeviceFleet:
    """Start the device processes, devices split evenly among them.

    They fork from the pre-imported forkserver (`device_context`) as fast as
    the harness starts them; each enrols as soon as it is up.
    """
    context = device_context()
    handle = DeviceFleet([], context.Event(), context.Queue(), context.Lock())
    groups = [g for g in np.array_split(np.arange(len(specs)), processes) if len(g)]
    for group in groups:
        spec = FleetSpec(devices=tuple(specs[i] for i in group), **fleet)
        proc = context.Process(
            target=run_device_process,
            args=(spec, handle.stop, handle.results, handle.connect_lock),
            daemon=True,
        )
        proc.start()
        handle.processes.append(proc)
    return handle


def start_forkserver() -> None:
    """Start the forkserver now: it imports `PRELOADED` while the harness sets up.

    It imports in its own process; this returns at once (a no-op where the
    processes are spawned).
    """
    if device_context().get_start_method() == "forkserver":
        multiprocessing.forkserver.ensure_running()


def device_context() -> Any:
    """The processes' start method: a forkserver with `PRELOADED` imported, or spawn.

    The preload list is the forkserver's (one per harness process): a
    forkserver already running keeps the modules it has.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))
    return context
