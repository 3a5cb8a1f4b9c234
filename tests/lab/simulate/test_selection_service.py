"""The service engine: Dubhe's rounds on the production coordinator and devices.

Its random numbers come from the devices' and the coordinator's own
generators, so its selections are not the fast engine's: the test compares
what matters, the distribution of ``||p_o - p_u||_1``, and the volunteers.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from ursa.lab.simulate.selection import (
    SelectionSimConfig,
    evaluate,
    make_population,
    simulate_selection,
)
from ursa.lab.simulate.selection_service import (
    SERVICE_MAX_CLIENTS,
    check_service_size,
    service_rounds,
)
from ursa.lab.simulate.selection_sums import SumBackend
from ursa.tools.cli.app import main
from ursa.tools.data.metrics import distributions

SMALL = SelectionSimConfig(
    num_clients=30, k=5, tries=(5,), rounds=30, seed=0, search_tries=50
)
TOLERANCE_SE = 3.0
"""Engines agree when their mean distances differ by at most 3 standard
errors of the difference (per-round spreads over sqrt(rounds))."""


@pytest.fixture(scope="module")
def both() -> tuple[dict[str, Any], dict[str, Any]]:
    fast = simulate_selection(SMALL, keep_selections=True)
    service = simulate_selection(replace(SMALL, engine="service"), keep_selections=True)
    return fast, service


def test_both_engines_select_k_distinct_devices_each_round(
    both: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    for report in both:
        rounds = report["selections"]["dubhe_H5"]
        assert len(rounds) == SMALL.rounds
        assert all(len(set(r)) == SMALL.k for r in rounds)
        assert all(0 <= d < SMALL.num_clients for r in rounds for d in r)
    fast, service = both
    assert service["config"]["engine"] == "service"
    assert service["service"]["H5"]["key_epochs"] == 1
    assert "service" not in fast
    assert fast["sigma"] == service["sigma"]  # one search, then each engine's rounds


def test_the_engines_agree_on_the_distance_distribution(
    both: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    fast, service = (r["dubhe"]["H5"] for r in both)
    error = math.sqrt((fast["std"] ** 2 + service["std"] ** 2) / SMALL.rounds)
    assert abs(fast["mean"] - service["mean"]) <= TOLERANCE_SE * error
    random = both[0]["random"]["mean"]
    assert max(fast["mean"], service["mean"]) < 0.8 * random  # both select better
    # eq. (6): about K volunteers per try, on either engine
    for report in both:
        assert abs(report["volunteers"]["mean"] - SMALL.k) < 1.5


def test_the_service_engine_is_seeded_under_the_paper_draw() -> None:
    population = make_population(SMALL)

    def run(seed: int, draw: str = "paper") -> list[list[int]]:
        played = service_rounds(
            population.counts,
            SMALL.codebook(),
            (0.6, 0.35),
            k=5,
            tries=3,
            rounds=4,
            seed=seed,
            draw=draw,
        )
        assert played.selections.shape == (4, 5) and played.key_epochs == 1
        return [sorted(set(r)) for r in played.selections.tolist()]

    assert run(1) == run(1) != run(2)
    # the stratified draw's shared seed comes from the epoch's fresh secret key
    assert all(len(r) == 5 for r in run(1, "stratified"))


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="engine"):
        SelectionSimConfig(engine="magic")
    service = replace(SMALL, engine="service")
    p = distributions(make_population(service).counts)
    with pytest.raises(ValueError, match="label counts"):
        evaluate(p, service)
    with pytest.raises(ValueError, match="no backend"):
        evaluate(
            p, service, counts=make_population(service).counts, backend=SumBackend()
        )
    with pytest.raises(ValueError, match="--force"):
        check_service_size(SERVICE_MAX_CLIENTS + 1)
    check_service_size(SERVICE_MAX_CLIENTS + 1, force=True)


def test_cli_engine_service(capsys: pytest.CaptureFixture[str]) -> None:
    cli = ["simulate", "selection", "--clients", "20", "--k", "4", "--rounds", "3"]
    cli += ["--tries", "1,3", "--search-tries", "10", "--engine", "service"]
    assert main([*cli, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["service"]) == {"H1", "H3"} == set(data["dubhe"])
    assert main(cli) == 0
    assert "engine service" in capsys.readouterr().out
    assert main([*cli, "--encrypted"]) == 2
    assert "--engine service" in capsys.readouterr().err
    too_many = str(SERVICE_MAX_CLIENTS + 1)
    assert main([*cli[:2], "--clients", too_many, "--engine", "service"]) == 2
    assert "--force" in capsys.readouterr().err
