from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.lab.simulate.selection import (
    SelectionSimConfig,
    SumBackend,
    simulate_selection,
)
from ursa.lab.simulate.selection_partition import (
    class_device_counts,
    selection_population,
)
from ursa.lab.simulate.selection_plot import participation_sweep, plot_selection
from ursa.tools.cli.app import main
from ursa.tools.data.metrics import distributions
from ursa.tools.data.partition import PartitionError

SMALL = SelectionSimConfig(
    num_classes=5,
    num_clients=120,
    k=8,
    rho=5.0,
    emd=1.2,
    tries=(1, 4),
    rounds=40,
    seed=3,
    search_tries=10,
    search_steps=3,
    draws=("paper", "stratified"),
)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return simulate_selection(SMALL)


def test_report_shape(report: dict[str, Any]) -> None:
    for key in ("population", "random", "greedy", "dubhe", "reduction_vs_random"):
        assert key in report
    assert set(report["dubhe"]) == {"H1", "H4"} == set(report["dubhe_stratified"])
    assert set(report["population"]) >= {
        "rho",
        "emd_avg",
        "requested_rho",
        "requested_emd",
    }
    assert len(report["sigma"]) == len(report["groups"]) == 3  # G = {1, 2, 5}
    assert report["sigma"][-1] == 0.0
    assert report["volunteers_stratified"] == {"mean": 8.0, "std": 0.0}


def test_population_meets_the_request(report: dict[str, Any]) -> None:
    pop = report["population"]
    assert pop["rho"] == pytest.approx(5.0, rel=0.05)
    assert pop["emd_avg"] == pytest.approx(1.2, rel=0.05)


def test_more_tries_never_hurt_and_reductions_are_consistent(
    report: dict[str, Any],
) -> None:
    for key, suffix in (("dubhe", ""), ("dubhe_stratified", "_stratified")):
        h1, h4 = report[key]["H1"]["mean"], report[key]["H4"]["mean"]
        assert h4 <= h1 + 1e-5  # the 4 tries include the first one
        got = report[f"reduction_vs_random{suffix}"]["H4"]
        assert got == pytest.approx(1 - h4 / report["random"]["mean"])
    assert report["greedy"]["mean"] < report["random"]["mean"]
    assert report["dubhe"]["H1"]["mean"] < report["random"]["mean"]


def test_class_proportions_are_distributions(report: dict[str, Any]) -> None:
    for name, props in report["class_proportions"].items():
        assert sum(props) == pytest.approx(1.0), name


def test_same_seed_same_report(report: dict[str, Any]) -> None:
    again = simulate_selection(SMALL)
    for key in ("population", "random", "greedy", "dubhe", "dubhe_stratified", "sigma"):
        assert again[key] == report[key]


def test_swapped_sum_backend_reproduces_the_selections(report: dict[str, Any]) -> None:
    calls = {"registry": 0, "tries": 0}

    def registry_sum(indices: np.ndarray, length: int) -> np.ndarray:
        calls["registry"] += 1
        out = np.zeros(length, dtype=np.int64)
        for i in indices:  # one "ciphertext" at a time
            out[i] += 1
        return out

    def try_sums(fixed: np.ndarray, selections: np.ndarray) -> np.ndarray:
        calls["tries"] += 1
        assert selections.ndim == 3  # rounds x tries x K
        return np.array([[sum(fixed[j] for j in row) for row in r] for r in selections])

    swapped = simulate_selection(SMALL, SumBackend(registry_sum, try_sums))
    assert calls["registry"] > 2 and calls["tries"] > 2
    for key in ("dubhe", "dubhe_stratified", "sigma", "sigma_stratified"):
        assert swapped[key] == report[key]


def test_a_backend_of_the_wrong_shape_is_refused() -> None:
    def flat(fixed: np.ndarray, selections: np.ndarray) -> np.ndarray:
        return fixed[selections.reshape(-1, selections.shape[-1])].sum(axis=1)

    with pytest.raises(ValueError, match="shape"):
        simulate_selection(SMALL, SumBackend(try_sums=flat))


def test_kept_selections_are_k_distinct_devices_per_round() -> None:
    config = SelectionSimConfig(
        num_classes=4,
        num_clients=60,
        k=5,
        emd=1.0,
        tries=(1, 3),
        rounds=7,
        sigma=(0.6, 0.3),
    )
    kept = simulate_selection(config, keep_selections=True)["selections"]
    assert set(kept) == {"dubhe_H1", "dubhe_H3"}
    for rows in kept.values():
        assert len(rows) == 7
        assert all(len(set(row)) == 5 and max(row) < 60 for row in rows)
    assert "selections" not in simulate_selection(config)


def test_class_device_counts_sum_to_n() -> None:
    counts = class_device_counts(10, np.array([0.55, 0.26, 0.19]))
    assert counts.tolist() == [6, 2, 2] or counts.tolist() == [5, 3, 2]
    assert counts.sum() == 10


@pytest.mark.parametrize("emd", [1.5, 1.62, 0.8])
def test_pairs_partition_meets_the_request_with_two_class_devices(emd: float) -> None:
    rng = np.random.default_rng(5)
    population = selection_population("pairs", 1000, 10, 10.0, emd, rng)
    assert population.rho == pytest.approx(10.0, rel=0.05)
    assert population.emd_avg == pytest.approx(emd, rel=0.02)
    p = distributions(population.counts)
    if emd >= 1.5:  # no i.i.d. share: at most two classes on every device
        assert (np.count_nonzero(population.counts, axis=1) <= 2).all()
    else:
        assert p.max(axis=1).max() < 1.0


def test_pairs_partition_refuses_what_it_cannot_make() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(PartitionError, match="out of reach"):
        selection_population("pairs", 200, 10, 10.0, 1.95, rng)
    with pytest.raises(PartitionError, match="without a device"):
        selection_population("pairs", 12, 10, 50.0, 1.0, rng)
    with pytest.raises(PartitionError, match="unknown partition"):
        selection_population("magic", 100, 10, 10.0, 1.0, rng)
    with pytest.raises(ValueError, match="partition"):
        SelectionSimConfig(partition="magic")


def test_pairs_lets_greedy_balance_exactly() -> None:
    config = SelectionSimConfig(
        num_clients=1000, k=20, tries=(1,), rounds=5, sigma=(0.7, 0.1)
    )
    pairs = simulate_selection(replace(config, partition="pairs"))
    dubhe = simulate_selection(config)
    assert pairs["population"]["partition"] == "pairs"
    assert pairs["greedy"]["mean"] < 0.5 * dubhe["greedy"]["mean"]


def test_fixed_sigma_skips_the_search() -> None:
    config = SelectionSimConfig(
        num_classes=4,
        num_clients=60,
        k=5,
        tries=(1,),
        rounds=5,
        emd=1.0,
        sigma=(0.6, 0.3),
    )
    assert simulate_selection(config)["sigma"] == [0.6, 0.3, 0.0]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="draws"):
        SelectionSimConfig(draws=("magic",))
    with pytest.raises(ValueError, match="K"):
        SelectionSimConfig(k=0)
    with pytest.raises(ValueError, match="tries"):
        SelectionSimConfig(tries=())


def test_sweep_and_plot(report: dict[str, Any], tmp_path: Path) -> None:
    sweep = participation_sweep(SMALL, (0.05, 1.0), rounds=5)
    assert sweep["k"] == [6, 120]
    assert set(sweep["methods"]) >= {"random", "greedy", "dubhe_H1", "dubhe_H4"}
    # everyone selected: every method sees the global distribution
    full = [stats["mean"][-1] for stats in sweep["methods"].values()]
    assert full == pytest.approx([sweep["baseline"]] * len(full))
    path = tmp_path / "selection.png"
    plot_selection(report, str(path), sweep)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


CLI = [
    "simulate", "selection", "--classes", "4", "--clients", "80", "--k", "6",
    "--rho", "4", "--emd", "1.0", "--tries", "1,3", "--rounds", "10", "--seed", "1",
    "--search-tries", "5",
]  # fmt: skip


def test_cli_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--json", "--draw", "both"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert out.count("\n") == 1
    assert set(data["dubhe"]) == {"H1", "H3"} == set(data["reduction_vs_random"])
    assert set(data["dubhe_stratified"]) == {"H1", "H3"}
    assert {"rho", "emd_avg", "requested_rho", "requested_emd"} <= set(
        data["population"]
    )
    assert set(data["random"]) == {"mean", "std"} == set(data["greedy"])
    assert data["groups"] == [1, 2, 4] and len(data["sigma"]) == 3


def test_cli_table_and_groups(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--groups", "1,4", "--sigma", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "dubhe H=3" in out and "greedy" in out and "[0.5, 0.0]" in out
    assert "partition dubhe" in out and "crypto" not in out


def test_cli_pairs_partition(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--partition", "pairs", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["population"]["partition"] == "pairs"
    assert data["config"]["partition"] == "pairs"


def test_cli_bad_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--emd", "1.99"]) == 2
    assert "out of reach" in capsys.readouterr().err
    assert main([*CLI, "--sigma", "0.5"]) == 2  # G = {1, 2, 4} needs two values
    with pytest.raises(SystemExit):
        main([*CLI, "--tries", "a,b"])
