from __future__ import annotations

import argparse
import json

import pytest

from ursa.lab.simulate.train import add_train_parser, config_from_args, main


def test_cli_runs_a_tiny_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["--devices", "10", "--rounds", "2", "--seeds", "0", "--methods",
         "fedavg,climb", "--local-epochs", "1", "--json"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)

    assert code == 0
    assert set(report["methods"]) == {"fedavg", "climb"}
    seed0 = report["methods"]["climb"]["seeds"][0]
    assert {"final_accuracy", "worst_minority_accuracy", "rounds_to_target"} <= set(
        seed0
    )
    assert "climb_targets" in report and "paper_climb_mnist" in report
    assert report["federations"][0]["partition"] == "climb"


def test_the_production_engine_runs_climb_on_the_production_objects(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(
        ["--devices", "6", "--rounds", "2", "--seeds", "0", "--methods", "climb",
         "--local-epochs", "1", "--engine", "production", "--key-bits", "512",
         "--json"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)

    climb = report["methods"]["climb"]["seeds"][0]["diagnostics"]["climb"]
    assert (climb["engine"], climb["dual_steps"], climb["encrypted"]) == (
        "production",
        2,
        True,
    )


def test_selections_are_compared_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(
        ["--devices", "10", "--rounds", "1", "--seeds", "0", "--methods", "fedavg",
         "--partition", "dubhe", "--selection", "random,dubhe", "-k", "4",
         "--local-epochs", "1", "--dubhe-tries", "2"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "fedavg/random" in out and "fedavg/dubhe" in out


def test_parser_registers_under_simulate() -> None:
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="simulation"))
    args = parser.parse_args(["train", "--methods", "climb", "--seeds", "3,4"])
    assert args.methods == ("climb",) and args.seeds == (3, 4)
    assert callable(args.handler)


def test_flags_map_one_to_one_onto_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="simulation"))
    args = parser.parse_args(["train", "--eta-d", "0.3", "--fedvc", "16", "-k", "20"])
    config = config_from_args(args)
    assert (config.eta_d, config.fedvc, config.participants) == (0.3, 16, 20)
    assert config.methods == ("fedavg", "focal", "climb")
