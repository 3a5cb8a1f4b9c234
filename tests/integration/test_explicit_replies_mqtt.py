"""Adaptive replies over a real Mosquitto: a small fleet never waits a window out.

Every window is set far longer than the test may run: the federation
finishes only because each volunteering window closes once every online
device has answered (their explicit "no"s included) and each distributions
step once every try member has.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from ursa.coordinator.config import DeadlinesConfig
from ursa.coordinator.service import CoordinatorService

pytestmark = pytest.mark.integration

N = 10
ROUNDS = 3
LONG_S = 3600.0
"""Every selection window: waiting one out fails the test's join."""


def test_a_small_fleet_answers_every_announce_and_no_window_runs_out(
    mqtt_federation: Any,
) -> None:
    fed = mqtt_federation("itexplicit")
    config = fed.coordinator_config(
        N,
        k=3,
        tries=3,
        rounds=ROUNDS,
        deadlines=DeadlinesConfig(
            key_epoch_s=20,
            registration_s=20,
            volunteer_s=LONG_S,
            distributions_s=LONG_S,
            agent_s=LONG_S,
            training_s=5,
        ),
    )
    service = CoordinatorService(config)
    service.start()
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    fed.start_devices(N)
    thread.join(timeout=120)
    service.stop()
    assert service.is_done, f"stuck at {service.state}"

    announces = [m for _, m in fed.capture.messages("round_announce")]
    assert {m.round for m in announces} == set(range(1, ROUNDS + 1))
    assert all(m.explicit_replies for m in announces)
    answers = [m for _, m in fed.capture.messages("volunteer")]
    assert Counter(m.round for m in answers) == {r: N for r in range(1, ROUNDS + 1)}
    assert any(not any(m.draws) for m in answers)  # the explicit "no"s went out
    results = [m for _, m in fed.capture.messages("selection_result")]
    assert sorted(m.round for m in results) == list(range(1, ROUNDS + 1))
    assert all(len(m.selected) == 3 for m in results)
