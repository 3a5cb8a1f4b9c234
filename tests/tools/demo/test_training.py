"""`ursa demo` (training): tiny runs with real device processes and a report."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.models.inference import OnnxClassifier
from ursa.tools.cli.app import build_parser, main
from ursa.tools.demo.population import demo_population
from ursa.tools.demo.settings import TrainingDemoSettings
from ursa.tools.demo.training import run_training_demo

pytestmark = pytest.mark.integration


def _held_out_split(settings: TrainingDemoSettings) -> Any:
    return demo_population(settings)


def test_tiny_demo_reports_held_out_accuracy_and_identical_onnx(
    tmp_path: Path,
) -> None:
    pytest.importorskip("amqtt")
    settings = TrainingDemoSettings(
        devices=6, k=2, tries=2, rounds=2, key_bits=512, processes=2,
        local_epochs=1, report_dir=tmp_path / "report", timeout_s=120,
        eval_every=1,
    )  # fmt: skip
    out, err = io.StringIO(), io.StringIO()

    report = run_training_demo(settings, out=out, err=err, as_json=True)

    printed = json.loads(out.getvalue().strip().splitlines()[-1])
    assert printed["completed"] and printed["onnx_check"]["identical"] is True
    assert [r["round"] for r in printed["rounds"]] == [1, 2]
    assert printed["final_accuracy"] == report["final_accuracy"]
    assert printed["methods"] == ["dubhe", "climb"]
    assert len(printed["per_class_accuracy"]) == 10
    fed = _held_out_split(settings)
    onnx = (tmp_path / "report" / "model.onnx").read_bytes()
    predictions = OnnxClassifier(onnx).predict(fed.test_x)
    assert float((predictions == fed.test_y).mean()) == pytest.approx(
        printed["final_accuracy"]
    )
    assert printed["onnx_check"]["samples"] == len(fed.test_y)
    assert all(r["dual_reporters"] == 6 for r in printed["rounds"])
    assert {d["device_id"] for d in printed["devices"]} == {
        f"dev{i:03d}" for i in range(6)
    }
    assert all(d["crypto_ms"] > 0 and d["bytes_sent"] > 0 for d in printed["devices"])
    files = set(printed["files"])
    assert {"summary.md", "report.json", "model.onnx", "accuracy.png"} <= files
    assert printed["files"][0] == "summary.md"  # the page to open first
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "lower is better" in summary and "dubhe, climb" in summary
    assert f"{printed['final_accuracy']:.4g}" in summary
    assert all((tmp_path / "report" / f).stat().st_size > 0 for f in files)
    assert "2/2 round 2: acc" in err.getvalue()
    assert "ursa demo: 6/6 devices enrolled" in err.getvalue()  # no silent start
    # federated evaluation (next to CLIMB's dual step): the model after round 1
    # on the devices' own held-out data, beside the server's test accuracy
    section = printed["federated_eval"]
    assert section["round"] == [1] and section["parties"] == [6]
    assert 0.0 <= section["accuracy"][0] <= 1.0 and len(section["per_class"][0]) == 10
    assert section["server_accuracy"] == [printed["rounds"][0]["accuracy"]]
    said = printed["rounds"][0]["device_metrics"]
    assert said["reporting"] == 2 and said["samples"] > 0 and said["train_s"] > 0


def test_settings_the_demo_cannot_run_are_refused_with_a_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--weighting", "feddisk", "--made-rounds", "0"]) == 2
    assert "--made-rounds must be at least 1" in capsys.readouterr().err
    assert main(["demo", "--devices", "4", "--k", "2"]) == 2
    assert "cannot deal the data out: EMD_avg 1.5" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("methods", "chosen"),
    [
        ("dubhe,climb", ("dubhe", "climb", "none")),
        ("dubhe,climb,flicker", ("dubhe", "climb", "flicker")),
        ("random, feddisk", ("random", "feddisk", "none")),
        ("dubhe,fedavg", ("dubhe", "none", "none")),
    ],
)
def test_methods_option_names_the_federation(
    methods: str, chosen: tuple[str, str, str]
) -> None:
    from ursa.tools.demo.settings import methods_options

    options = methods_options(methods)
    assert (options["selection"], options["weighting"], options["balance"]) == chosen
    settings = TrainingDemoSettings(
        selection=options["selection"],
        weighting=options["weighting"],
        balance=options["balance"],
    )
    assert settings.methods() == [m.strip() for m in methods.split(",")]


@pytest.mark.parametrize(
    ("methods", "says"),
    [
        ("dubhe", "one selection (dubhe, random) and one training"),
        ("dubhe,random,climb", "one selection"),
        ("dubhe,climb,climb", "named twice"),
        ("dubhe,sgd", "unknown sgd"),
        ("dubhe,feddisk,flicker", "flicker with feddisk is not supported yet"),
    ],
)
def test_methods_option_refuses_what_cannot_run(
    methods: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--methods", methods]) == 2
    assert says in capsys.readouterr().err


def test_selection_only_keeps_its_own_defaults() -> None:
    from ursa.tools.cli.demo import _option

    parser = build_parser()
    selection = parser.parse_args(["demo", "--selection-only"])
    training = parser.parse_args(["demo", "--k", "3"])

    assert (_option(selection, "devices"), _option(selection, "k")) == (50, 10)
    assert (_option(training, "devices"), _option(training, "k")) == (20, 3)
    assert _option(training, "rounds") == 25


def test_report_json_is_strict() -> None:
    from ursa.tools.demo.report import json_safe

    cleaned = json_safe({"a": float("nan"), "b": [1.0, float("inf")], "c": (2, "x")})

    assert cleaned == {"a": None, "b": [1.0, None], "c": [2, "x"]}
    json.dumps(cleaned, allow_nan=False)


def test_flicker_corrects_the_global_mix_in_the_same_federation_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("amqtt")
    pytest.importorskip("tenseal")
    argv = [
        "demo", "--methods", "dubhe,climb,flicker", "--json", "--devices", "6",
        "--k", "2",
        "--tries", "2", "--rounds", "2", "--emd", "0.5", "--key-bits", "512",
        "--processes", "2", "--local-epochs", "1", "--timeout", "120",
        "--report-dir", str(tmp_path / "report"),
    ]  # fmt: skip

    code = main(argv)

    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert code == 0 and report["completed"]
    assert [r["round"] for r in report["rounds"]] == [1, 2]
    assert report["methods"] == ["dubhe", "climb", "flicker"]
    flicker = report["flicker"]
    assert flicker["phase"] == "done" and flicker["failure"] is None
    assert flicker["gi_after"] > flicker["gi_before"]
    resampled = flicker["resampled_devices"]
    assert resampled and set(resampled) <= set(flicker["devices"])
    assert all(flicker["devices"][d]["steps"] > 0 for d in resampled)
    if flicker["stop_reason"] == "balanced":
        assert flicker["gi_after"] >= flicker["nabla"]
    rows = flicker["devices"]
    assert set(rows) == {f"dev{i:03d}" for i in range(6)}
    before = np.sum([r["counts_before"] for r in rows.values()], axis=0)
    after = np.sum([r["counts_after"] for r in rows.values()], axis=0)
    assert before.tolist() == flicker["global_counts_before"]
    assert after.tolist() == flicker["global_counts_after"]
    net = flicker["samples_added"] - flicker["samples_removed"]
    assert flicker["samples_added"] > 0 and int((after - before).sum()) == net
    assert flicker["wall_s"] > 0 and flicker["rejections"] == 0
    assert "FLICKER done: GI" in captured.err
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["flicker"]["gi_after"] == flicker["gi_after"]


def test_flicker_needs_a_ring_of_three(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--balance", "flicker", "--devices", "2", "--k", "1"]) == 2
    assert "needs at least 3 devices" in capsys.readouterr().err


def test_random_feddisk_demo_runs_made_rounds_then_weighted_classifier_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("amqtt")
    argv = [
        "demo", "--methods", "random,feddisk", "--made-rounds", "2", "--json",
        "--devices", "6", "--k", "2", "--tries", "2", "--rounds", "2",
        "--key-bits", "512", "--processes", "2", "--local-epochs", "1",
        "--timeout", "240", "--report-dir", str(tmp_path / "report"),
    ]  # fmt: skip

    code = main(argv)

    captured = capsys.readouterr()
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert code == 0 and report["completed"], captured.err[-2000:]
    assert report["onnx_check"]["identical"] is True
    assert report["methods"] == ["random", "feddisk"]
    section = report["feddisk"]
    made = section["made_rounds"]
    assert 1 <= made <= 2 and section["switch_round"] == made + 1
    assert [r["round"] for r in section["made"]] == list(range(1, made + 1))
    assert all(np.isfinite(r["test_nll"]) for r in section["made"])
    assert [r["round"] for r in report["rounds"]][:2] == [made + 1, made + 2]
    assert section["effective_rounds"] == made + len(report["rounds"])
    assert "FedDisk: MADE phase over at round" in captured.err
