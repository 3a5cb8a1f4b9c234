"""Fixtures for the fault-injection suite: a fleet per test, one fault-free run.

`fleet(**settings)` builds a `FaultFleet` in the test's tmp_path (closed after
the test). `baseline` is the fault-free run with the default settings, run
once per session; scenarios compare their final accuracy with it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ursa.lab.faults import FaultFleet, FleetSettings, RunOutcome

RUN_TIMEOUT_S = 240.0
"""A coordinator still running then has wedged (a fault-free run: 30-90 s)."""

MakeFleet = Callable[..., FaultFleet]

extended = pytest.mark.skipif(
    os.environ.get("URSA_FAULTS_EXTENDED") != "1",
    reason="extended fault scenario: URSA_FAULTS_EXTENDED=1 python -m pytest "
    "tests/faults (CI runs the core ones and stays under 30 minutes)",
)
"""Scenarios other tests already cover in part (the 30% loss over Mosquitto
in tests/integration/test_federation.py) or that take longest."""

TOLERANCE = 0.15
"""Held-out accuracy a faulty run may lose (or gain) against the fault-free one."""
OUTAGE_S = 5.0
DEFAULTS = FleetSettings()


def assert_recovered(
    outcome: RunOutcome, baseline: RunOutcome, *, full_rounds: bool = True
) -> None:
    """Every round complete, nobody counted twice, accuracy near the baseline."""
    rounds = DEFAULTS.rounds
    assert outcome.completed_rounds == rounds
    assert outcome.model_version == rounds
    assert sorted(outcome.updates_per_round) == list(range(1, rounds + 1))
    for index, devices in outcome.contributors.items():
        twice = [d for d, n in Counter(devices).items() if n > 1]
        assert not twice, f"round {index} counted {twice} twice"
    if full_rounds:  # no update lost
        assert outcome.updates_per_round == dict.fromkeys(
            range(1, rounds + 1), DEFAULTS.k
        )
    assert abs(outcome.accuracy - baseline.accuracy) <= TOLERANCE, (
        outcome.accuracy,
        baseline.accuracy,
    )


def start(fleet: FaultFleet) -> None:
    """Start the coordinator, then every device."""
    fleet.start_coordinator()
    fleet.start_devices()


def run_to_end(fleet: FaultFleet, *, since: int = 0) -> RunOutcome:
    """Wait for the coordinator, SIGTERM the devices, judge the run.

    ``since``: judge the coordinator's log from this offset (a later run).
    Asserts that nothing crashed: the coordinator exits 0, every device
    still running exits 0 on SIGTERM, and no log shows a traceback.
    """
    code = fleet.wait_coordinator(RUN_TIMEOUT_S)
    device_codes = fleet.stop_devices()
    assert code == 0, f"coordinator exit {code}:\n{fleet.log()[-4000:]}"
    assert all(c == 0 for c in device_codes.values()), device_codes
    tracebacks = fleet.tracebacks()
    assert not tracebacks, tracebacks
    outcome = fleet.outcome(code, since=since)
    print(  # shown with -s: the figures a report quotes
        f"\n{fleet.work_dir}: {outcome.completed_rounds} rounds, updates "
        f"{outcome.updates_per_round}, accuracy {outcome.accuracy:.3f}"
    )
    return outcome


@pytest.fixture
def fleet(mosquitto_binary: Path, tmp_path: Path) -> Iterator[MakeFleet]:
    made: list[FaultFleet] = []

    def make(**settings: Any) -> FaultFleet:
        built = FaultFleet(
            tmp_path / f"fleet{len(made)}",
            FleetSettings(**settings),
            mosquitto=mosquitto_binary,
        )
        made.append(built)
        built.start_broker()
        return built

    yield make
    for built in made:
        built.close()


@pytest.fixture(scope="session")
def baseline(
    mosquitto_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunOutcome]:
    """The fault-free run with the default settings (the reference accuracy)."""
    built = FaultFleet(
        tmp_path_factory.mktemp("baseline"), FleetSettings(), mosquitto=mosquitto_binary
    )
    try:
        built.start_broker()
        built.start_coordinator()
        built.start_devices()
        yield run_to_end(built)
    finally:
        built.close()
