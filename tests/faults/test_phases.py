"""Coordinator ``kill -9`` and broker outages in each phase, per method (issue 14).

Judged as `test_scenarios`: every round complete with K updates, nobody
counted twice, accuracy within `TOLERANCE` of the fault-free run, no crash.
The coordinator is restarted with the same config and state directory; a
broker outage lasts `OUTAGE_S`.
"""

from __future__ import annotations

import re
import time

import pytest

from ursa.lab.faults import FaultFleet, RunOutcome

from .conftest import (
    OUTAGE_S,
    MakeFleet,
    assert_recovered,
    extended,
    run_to_end,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _outage(run: FaultFleet) -> None:
    run.stop_broker()
    time.sleep(OUTAGE_S)
    run.start_broker()


def _restart(run: FaultFleet) -> None:
    run.kill_coordinator()
    run.start_coordinator()  # same config, same state directory


def test_coordinator_sigkill_during_enrolment_resumes(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    run = fleet()
    start(run)
    run.wait_for_log(r"enrolled d\d\d")
    _restart(run)

    outcome = run_to_end(run)

    assert_recovered(outcome, baseline)
    # no second first epoch (one "key epoch 1: agent dNN, N recipients" line)
    assert len(re.findall(r"key epoch 1: agent \S+, \d+ recipients", run.log())) == 1
    # a device enrolled just before the kill, its answer lost, says hello
    # again and registers: nobody is waited for in vain
    registered = re.findall(r"registry sum of (\d+) devices", run.log())
    assert registered and set(registered) == {"6"}, registered


def test_coordinator_sigkill_during_the_key_epoch_resumes(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    run = fleet()
    start(run)
    run.wait_for_log(r"key epoch 1: agent")
    _restart(run)

    outcome = run_to_end(run)

    assert_recovered(outcome, baseline)


@extended
def test_coordinator_sigkill_during_dubhe_selection_resumes(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    run = fleet(selection="dubhe")
    start(run)
    run.wait_for_log(r"round 1 complete")  # round 2 is announced in that step
    _restart(run)

    outcome = run_to_end(run)

    assert_recovered(outcome, baseline)


@extended
def test_broker_outage_during_dubhe_selection_delays_but_does_not_wedge(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    run = fleet(selection="dubhe")
    start(run)
    run.wait_for_log(r"round 1 complete")
    _outage(run)

    outcome = run_to_end(run)

    assert_recovered(outcome, baseline)


@extended
def test_broker_outage_during_climbs_dual_step_delays_but_does_not_wedge(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    run = fleet(training="climb")
    start(run)
    run.wait_for_log(r"round 2: selected")  # the dual step opens next
    _outage(run)

    outcome = run_to_end(run)

    assert_recovered(outcome, baseline)
    assert "round 2: dual step summed" in run.log()


@extended
def test_broker_outage_during_flickers_loop_delays_but_does_not_wedge(
    fleet: MakeFleet, baseline: RunOutcome
) -> None:
    pytest.importorskip("tenseal")
    # digits are near balanced: a target above their imbalance keeps the
    # loop going until its bound on updates
    run = fleet(flicker=True, flicker_nabla=0.99, flicker_max_updates=3)
    start(run)
    run.wait_for_log(r"FLICKER ring ")
    _outage(run)

    outcome = run_to_end(run)

    assert_recovered(outcome, baseline)
    assert "FLICKER done" in run.log()
