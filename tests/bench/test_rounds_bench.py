"""`ursa bench rounds`: the demo's job per method, tiny, with real device processes."""

from __future__ import annotations

import io
import json

import pytest

from ursa.bench.rounds import non_training_s, run


def test_non_training_time_takes_off_the_slowest_selected_devices_training() -> None:
    rounds = [
        {"round": 1, "selected": ["a", "b"], "wall_s": 5.0},
        {"round": 2, "selected": ["b"], "wall_s": 3.0},
        {"round": 3, "selected": ["a"], "wall_s": None},  # not completed: left out
    ]
    devices = [
        {"device_id": "a", "round_train_s": [[1, 1.5], [3, 9.0]]},
        {"device_id": "b", "round_train_s": [[1, 4.0]]},  # failed round 2
    ]

    assert non_training_s(rounds, devices) == [1.0, 3.0]


@pytest.mark.integration
@pytest.mark.slow
def test_a_tiny_run_reports_every_method_and_the_budget() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("amqtt")
    out = io.StringIO()

    code = run(
        rounds=2,
        devices=6,
        k=2,
        tries=2,
        key_bits=512,
        local_epochs=1,
        as_json=True,
        out=out,
        err=io.StringIO(),
    )

    figures = json.loads(out.getvalue())
    assert figures["completed"] is True
    for label in ("random", "dubhe", "dubhe_climb"):
        assert figures[f"{label}_rounds"] == 2
        median = figures[f"{label}_non_training_s_median"]
        assert 0.0 < median < figures[f"{label}_round_wall_s_median"]
        assert figures[f"{label}_received_kib_per_device_round"] > 0
        assert figures[f"{label}_sent_kib_per_device_round"] > 0
        assert figures[f"{label}_device_peak_rss_mib"] > 10  # torch is in there
    ratio = figures["dubhe_non_training_vs_random"]
    assert figures["budgets_met"] is (ratio <= 2.0)
    assert code == (0 if ratio <= 2.0 else 1)
