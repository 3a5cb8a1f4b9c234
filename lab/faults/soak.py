"""Soak: a long run with random churn and broker restarts, bounded in time.

    python -m ursa.lab.faults.soak --rounds 200 --minutes 20

Runs a `FaultFleet` (real processes, a private Mosquitto with persistence)
and, every few seconds until the coordinator finishes or the time is up,
injects one random fault: a broker outage of 1-8 s, a device rebooted
(SIGKILL, back 1-5 s later), a device killed for good (at most a third of
the fleet; the coordinator's quorum lets it go on), or a coordinator
SIGKILL and restart. Prints a summary and exits 0 when no process crashed,
no device was counted twice in a round and rounds kept completing; 1 otherwise.
Not part of the test suite (`tests/faults/` is its short form).
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ursa.lab.faults.fleet import FaultFleet, FleetSettings

__all__ = ["main", "soak"]

FAULTS = ("broker_outage", "device_reboot", "device_gone", "coordinator_kill")


def soak(
    work_dir: Path,
    settings: FleetSettings,
    *,
    minutes: float,
    every_s: tuple[float, float],
    seed: int,
) -> tuple[bool, str]:
    """Run the soak; return (passed, summary text)."""
    rng = random.Random(seed)
    fleet = FaultFleet(work_dir, settings)
    injected: Counter[str] = Counter()
    gone: list[str] = []
    started = time.monotonic()
    end = started + 60.0 * minutes
    try:
        fleet.start_broker()
        fleet.start_coordinator()
        fleet.start_devices()
        assert fleet.coordinator is not None
        while time.monotonic() < end and fleet.coordinator.poll() is None:
            time.sleep(rng.uniform(*every_s))
            if fleet.coordinator.poll() is not None or time.monotonic() >= end:
                break
            fault = rng.choice(FAULTS)
            present = [d for d in fleet.device_ids if d not in gone]
            if fault == "device_gone" and len(gone) + 1 > settings.devices // 3:
                fault = "device_reboot"
            if fault == "broker_outage":
                fleet.stop_broker()
                time.sleep(rng.uniform(1.0, 8.0))
                fleet.start_broker()
            elif fault == "device_reboot":
                device = rng.choice(present)
                fleet.kill_device(device)
                time.sleep(rng.uniform(1.0, 5.0))
                fleet.start_device(device)
            elif fault == "device_gone":
                device = rng.choice(present)
                fleet.kill_device(device)
                gone.append(device)
            else:
                fleet.kill_coordinator()
                fleet.start_coordinator()
            injected[fault] += 1
        finished = fleet.coordinator.poll() is not None
        if not finished:  # time is up: stop it as an operator would
            fleet.coordinator.send_signal(signal.SIGTERM)
        try:
            code = fleet.coordinator.wait(timeout=60)
        except subprocess.TimeoutExpired:
            fleet.kill_coordinator()
            code = -9
        device_codes = fleet.stop_devices()
        outcome = fleet.outcome(code)
        tracebacks = fleet.tracebacks()
    finally:
        fleet.close()
    elapsed_s = time.monotonic() - started
    twice = {
        r: sorted(d for d, n in Counter(ds).items() if n > 1)
        for r, ds in outcome.contributors.items()
        if len(set(ds)) != len(ds)
    }
    counts = list(outcome.updates_per_round.values())
    crashed = {d: c for d, c in device_codes.items() if c != 0}
    passed = (
        code == 0
        and not crashed
        and not tracebacks
        and not twice
        and outcome.completed_rounds > 0
    )
    lines = [
        f"soak: {'PASS' if passed else 'FAIL'} after {elapsed_s:.0f} s "
        f"({'finished' if finished else 'time limit, stopped with SIGTERM'})",
        f"rounds completed: {outcome.completed_rounds}/{settings.rounds} "
        f"(model version {outcome.model_version})",
        "faults injected: "
        + (", ".join(f"{k} {injected[k]}" for k in FAULTS) or "none")
        + f"; devices gone for good: {gone or 'none'}",
        "updates per round: "
        + (
            f"min {min(counts)}, mean {sum(counts) / len(counts):.2f}, "
            f"max {max(counts)} (K={settings.k}); rounds with fewer than K: "
            f"{sum(1 for c in counts if c < settings.k)}"
            if counts
            else "none"
        ),
        f"devices counted twice in a round: {twice or 'none'}",
        f"final held-out accuracy: {outcome.accuracy:.3f}",
        f"coordinator exit: {code}; devices not exiting 0 on SIGTERM: "
        f"{crashed or 'none'}",
        f"logs with a traceback: {sorted(tracebacks) or 'none'}",
        f"logs: {fleet.logs}",
    ]
    return passed, "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the soak, print the summary."""
    parser = argparse.ArgumentParser(prog="python -m ursa.lab.faults.soak")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--every-s", type=float, nargs=2, default=(10.0, 30.0),
        help="a fault every MIN..MAX seconds (default 10 30)",
    )  # fmt: skip
    parser.add_argument(
        "--work-dir", type=Path, help="keep configs, state and logs here"
    )
    args = parser.parse_args(argv)
    settings = FleetSettings(
        devices=args.devices,
        k=args.k,
        rounds=args.rounds,
        quorum=max(args.k, args.devices - args.devices // 3),
        epochs=1,
        seed=args.seed,
    )
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="ursa-soak-"))
    passed, summary = soak(
        work_dir,
        settings,
        minutes=args.minutes,
        every_s=tuple(args.every_s),
        seed=args.seed,
    )
    print(summary)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
