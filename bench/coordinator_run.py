"""One size of `ursa bench coordinator`: the real coordinator and N simulated devices.

The coordinator is built by `ursa.tools.compose.build_coordinator` (what
`ursa coordinator serve` runs), with its SQLite store in a temporary
directory, on an `InMemoryBus` whose payload cap is the MQTT transport's.
The simulated fleet (`ursa.bench.coordinator_fleet`) is one client of the
bus that publishes on every device's topics and reacts to what the
coordinator sends. Everything runs on this thread, message by message: the
devices' next message is published only when the coordinator has handled
the last (depth first: a device answers at once, the agent's stream of
sealed keys goes on after).

Time, for the coordinator, is its own CPU so far (`_Clock`): the devices
answer at once, so a window (the volunteers', say) closes early only when
the coordinator's own work outlasts it, whatever else loads the machine.
When neither side has anything to send the coordinator waits for a deadline:
its clock jumps to the stage's deadline (or by 0.25 s, doubling while nothing
moves) and it ticks, as its run loop would. The key epoch's two deadlines
are raised to 30 minutes, so that a slow key epoch is measured, not cut
short; the selection windows are the product's defaults.

CPU: ``time.process_time()`` over each phase minus the fleet's own work on
this thread (``time.thread_time()`` outside the coordinator's calls), so a
coordinator thread of its own (a store committing in the background) is
counted, and key generation, sealing and encryption by the devices are not.
Inbound messages: what the fleet published to the coordinator in the phase.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
import tempfile
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ursa.bench.coordinator_fleet import SimulatedFleet, SimulatedPublish
from ursa.coordinator.config import (
    CoordinatorConfig,
    DeadlinesConfig,
    EnrolmentConfig,
    RegistryConfig,
    SelectionConfig,
)
from ursa.coordinator.enrolment_list import EnrolmentList
from ursa.coordinator.service import CoordinatorService
from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport
from ursa.protocol.messages import COORDINATOR
from ursa.protocol.party_bound import DEFAULT_MAX_PARTIES
from ursa.tools.compose import build_coordinator

__all__ = ["BenchStalledError", "SizeSettings", "measure_size"]

FEDERATION = "bench"
MAX_WAIT_S = 3600.0
"""Coordinator seconds a phase may wait without progress before the run fails."""
FIRST_WAIT_S = 0.25
LONGEST_WAIT_S = 64.0


class BenchStalledError(RuntimeError):
    """The coordinator made no progress for `MAX_WAIT_S` of its time."""


@dataclass(frozen=True)
class SizeSettings:
    """What one size runs (see `ursa.bench.coordinator.run`)."""

    devices: int
    k: int = 20
    tries: int = 5
    rounds: int = 3
    key_bits: int = 2048
    pool: int = 64
    enrolment: Literal["pinned", "tofu"] = "pinned"
    all_volunteer: bool = False
    explicit_replies_below: int | None = None
    """``[selection] explicit_replies_below`` (None: the coordinator's default)."""
    seed: int = 0


class _Clock:
    """The coordinator's time: its own CPU so far, plus jumps past deadlines.

    The devices answer at once and the coordinator's time passes only as it
    works, so a deadline closes a phase early only when the coordinator's own
    work outlasts it, however loaded the machine is.
    """

    def __init__(self, cpu: Callable[[], float]) -> None:
        self._origin = time.time()
        self._cpu = cpu
        self.skew = 0.0

    def __call__(self) -> float:
        return self._origin + self._cpu() + self.skew


@dataclass
class _Phase:
    coordinator_cpu_s: float = 0.0
    inbound: int = 0
    wall_s: float = 0.0
    waits: int = 0
    waited_s: float = 0.0


class _Meter:
    """Coordinator CPU per phase: process CPU minus the fleet's thread CPU."""

    def __init__(self, on_phase: Callable[[str], None] | None = None) -> None:
        self.phases: defaultdict[str, _Phase] = defaultdict(_Phase)
        self._on_phase = on_phase
        self.phase = "start"
        self._inside = 0.0
        self._mark_process = time.process_time()
        self._mark_outside = time.thread_time()
        self._mark_wall = time.perf_counter()

    @contextlib.contextmanager
    def coordinator(self) -> Iterator[None]:
        """Mark the enclosed thread CPU as the coordinator's."""
        started = time.thread_time()
        try:
            yield
        finally:
            self._inside += time.thread_time() - started

    def timed(
        self, handler: Callable[[str, bytes], None]
    ) -> Callable[[str, bytes], None]:
        """``handler`` with its thread CPU counted as the coordinator's."""

        def call(topic: str, payload: bytes) -> None:
            with self.coordinator():
                handler(topic, payload)

        return call

    def spent(self) -> float:
        """The coordinator's CPU on this thread so far."""
        return self._inside

    def switch(self, phase: str) -> None:
        """Close the current phase's figures and open ``phase``."""
        process, outside = time.process_time(), time.thread_time() - self._inside
        wall = time.perf_counter()
        figures = self.phases[self.phase]
        figures.coordinator_cpu_s += (process - self._mark_process) - (
            outside - self._mark_outside
        )
        figures.wall_s += wall - self._mark_wall
        self._mark_process, self._mark_outside, self._mark_wall = process, outside, wall
        self.phase = phase
        if self._on_phase is not None:
            self._on_phase(phase)


def _config(settings: SizeSettings, state_dir: Path) -> CoordinatorConfig:
    return CoordinatorConfig(
        federation=FEDERATION,
        state_dir=state_dir,
        enrolment=EnrolmentConfig(mode=settings.enrolment),
        min_devices=settings.devices,
        k=settings.k,
        tries=settings.tries,
        rounds=settings.rounds,
        key_bits=settings.key_bits,
        registry=RegistryConfig(max_parties=max(DEFAULT_MAX_PARTIES, settings.devices)),
        deadlines=DeadlinesConfig(
            key_epoch_s=MAX_WAIT_S / 2, registration_s=MAX_WAIT_S / 2
        ),
        seed=settings.seed,
        selection=SelectionConfig()
        if settings.explicit_replies_below is None
        else SelectionConfig(explicit_replies_below=settings.explicit_replies_below),
    )


def _rss_mib(field_name: str) -> float:
    """``VmRSS`` or ``VmHWM`` of this process in MiB (0 where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


class _LogTail(logging.Handler):
    """Keeps the coordinator's last warnings (a failed run says why)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.last: deque[str] = deque(maxlen=3)

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.last.append(record.getMessage()[:300])


class _Run:
    """The message loop of one size."""

    def __init__(
        self,
        settings: SizeSettings,
        tmp: Path,
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.fleet = SimulatedFleet(
            FEDERATION,
            settings.devices,
            pool=settings.pool,
            seed=settings.seed,
            all_volunteer=settings.all_volunteer,
        )
        hello = self.fleet.enrolment_messages()
        config = _config(settings, tmp / "coordinator")
        if settings.enrolment == "pinned":  # as `ursa coordinator enrol` does
            EnrolmentList(pins=self.fleet.fingerprints()).save(config.state_dir)
        gc.collect()
        gc.freeze()  # the fleet's identities are not the coordinator's garbage
        self.baseline_rss_mib = _rss_mib("VmRSS")
        self.meter = _Meter(on_phase)
        self.bus = InMemoryBus()
        self.clock = _Clock(self.meter.spent)
        self.coordinator_link = InMemoryTransport(self.bus, COORDINATOR)
        self.service: CoordinatorService = build_coordinator(
            config, transport=self.coordinator_link, clock=self.clock
        )
        self.inbox: deque[tuple[str, bytes]] = deque()
        self.link = InMemoryTransport(self.bus, "bench-fleet")
        self.link.set_handler(
            lambda topic, payload: self.inbox.append((topic, payload))
        )
        self.link.subscribe(f"ursa/v1/{FEDERATION}/global/#")
        self.link.subscribe(f"ursa/v1/{FEDERATION}/dev/+/down/#")
        self.link.connect()
        self.pending: list[Iterator[SimulatedPublish]] = [iter(hello)]
        self.completed = 0
        self.admission_drops = 0

    def run(self) -> None:
        with self.meter.coordinator():
            self.service.start()
        self.coordinator_link.set_handler(self.meter.timed(self.service.handle))
        self._react()
        self.meter.switch("enrolment")
        wait = FIRST_WAIT_S
        try:
            while not self._done():
                item = self._next()
                if item is not None:
                    self._publish(item)
                    while item is not None and item.burst:
                        item = next(self.pending[-1], None)
                        if item is not None:
                            self._publish(item)
                    self._react()
                    wait = FIRST_WAIT_S
                    continue
                wait = self._wait(wait)
        finally:
            if self.meter.phase != "end":
                self.meter.switch("end")
            stats = self.service.admission_stats()
            self.admission_drops = sum(stats.dropped.values())
            self.service.stop()
            self.link.close()

    def _publish(self, item: SimulatedPublish) -> None:
        self.meter.phases[self.meter.phase].inbound += 1
        self.link.publish(item.topic, item.payload, qos=item.qos, retain=item.retain)

    def _done(self) -> bool:
        return self.fleet.finished or self.completed >= self.settings.rounds

    def _next(self) -> SimulatedPublish | None:
        while self.pending:
            item = next(self.pending[-1], None)
            if item is not None:
                return item
            self.pending.pop()
        return None

    def _wait(self, wait: float) -> float:
        """Nothing to send: move the coordinator's clock on and let it tick."""
        phase = self.meter.phases[self.meter.phase]
        now, deadline = self.clock(), self.service.state.deadline_at
        step = (
            deadline - now + 0.001 if deadline is not None and deadline > now else wait
        )
        if phase.waited_s + step > MAX_WAIT_S:
            stage = self.service.state.stage
            raise BenchStalledError(
                f"{self.meter.phase}: no progress in {MAX_WAIT_S:.0f} s of "
                f"coordinator time (stage {stage}; device errors "
                f"{dict(self.fleet.errors)})"
            )
        self.clock.skew += step
        phase.waits += 1
        phase.waited_s += step
        with self.meter.coordinator():
            self.service.tick()
        self._react()
        return min(wait * 2, LONGEST_WAIT_S)

    def _react(self) -> None:
        """The devices' reactions to what the coordinator sent (phase changes too)."""
        while self.inbox:
            topic, payload = self.inbox.popleft()
            kind, reactions = self.fleet.react(topic, payload)
            self.pending.append(reactions)
            self._follow(kind)

    def _follow(self, kind: str) -> None:
        meter = self.meter
        if kind == "key_epoch_start" and not meter.phase.startswith("round"):
            meter.switch("key_epoch")
        elif kind == "registry_sum" and meter.phase == "key_epoch":
            meter.switch(f"round{self.completed + 1}")
        elif kind == "selection_result":
            self.completed = max(self.fleet.selected, default=0)
            meter.switch(f"round{self.completed + 1}")


def measure_size(
    settings: SizeSettings, on_phase: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run enrolment, a key epoch and the rounds at one size; its figures.

    A run whose coordinator stops making progress returns the figures so far
    with an ``error`` that names the phase and the coordinator's last
    warnings. ``on_phase`` hears each phase as it starts.
    """
    tail = _LogTail()
    root = logging.getLogger("ursa")
    root.addHandler(tail)
    started = time.perf_counter()
    error = None
    try:
        with tempfile.TemporaryDirectory(prefix="ursa-bench-coordinator-") as tmp:
            run = _Run(settings, Path(tmp), on_phase)
            try:
                run.run()
            except BenchStalledError as exc:
                error = f"{exc}; last warnings: {list(tail.last)}"
            end_rss = _rss_mib("VmRSS")
    finally:
        root.removeHandler(tail)
        gc.unfreeze()
    figures = _figures(settings, run, end_rss, tail, time.perf_counter() - started)
    parties = run.fleet.registry_parties
    if error is None and parties < settings.devices:
        error = (
            f"only {parties} of {settings.devices} devices in the key epoch's "
            f"registry ({run.admission_drops} messages dropped at admission)"
        )
    if error is not None:
        figures["error"] = error
    return figures


def _figures(
    settings: SizeSettings,
    run: _Run,
    end_rss_mib: float,
    tail: _LogTail,
    wall_s: float,
) -> dict[str, Any]:
    phases = run.meter.phases
    rounds = [phases[f"round{r}"] for r in range(1, run.completed + 1)]
    round_cpu = [p.coordinator_cpu_s for p in rounds]
    inbound = [p.inbound for p in rounds]
    n_rounds = max(1, len(rounds))
    enrolment, epoch = phases["enrolment"], phases["key_epoch"]
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "devices": settings.devices,
        "rounds_completed": run.completed,
        "key_epoch_cpu_s": epoch.coordinator_cpu_s,
        "coordinator_cpu_s_per_round": sum(round_cpu) / n_rounds,
        "coordinator_inbound_per_round": sum(inbound) / n_rounds,
        "us_per_inbound_message": 1e6 * sum(round_cpu) / max(1, sum(inbound)),
        "rss_mib": peak_kib / 1024.0,
        "coordinator_rss_mib": max(0.0, end_rss_mib - run.baseline_rss_mib),
        "enrolment_cpu_s": enrolment.coordinator_cpu_s,
        "enrolment_inbound": enrolment.inbound,
        "key_epoch_inbound": epoch.inbound,
        "round_cpu_s": round_cpu,
        "round_inbound": inbound,
        "round_waits": [p.waits for p in rounds],
        "round_waited_s": [p.waited_s for p in rounds],
        "volunteers_drawn_per_round": [
            run.fleet.volunteers_sent.get(r, 0) for r in range(1, run.completed + 1)
        ],
        "selected_per_round": [
            run.fleet.selected.get(r, 0) for r in range(1, run.completed + 1)
        ],
        "key_epochs": run.fleet.key_epochs,
        "registry_parties": run.fleet.registry_parties,
        "admission_drops": run.admission_drops,
        "device_errors": dict(run.fleet.errors),
        "coordinator_warnings": tail.count,
        "k": settings.k,
        "tries": settings.tries,
        "key_bits": settings.key_bits,
        "enrolment": settings.enrolment,
        "volunteers": "all" if settings.all_volunteer else "drawn",
        "replies": _replies(run.fleet.explicit_rounds, run.completed),
        "ciphertext_pool": settings.pool,
        "bench_wall_s": wall_s,
    }


def _replies(explicit: set[int], rounds: int) -> str:
    """The rule the size's rounds ran: ``explicit``, ``silence`` or ``mixed``."""
    if not explicit:
        return "silence"
    return "explicit" if len(explicit) >= rounds else "mixed"
