"""`ursa coordinator serve` / `ursa device run` / `ursa model init`: setup."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.tools.cli import service as cli_service


def test_subcommands_parse() -> None:
    parser = argparse.ArgumentParser()
    cli_service.register(parser.add_subparsers(dest="command", required=True))
    serve = parser.parse_args(["coordinator", "serve", "--config", "c.toml"])
    run = parser.parse_args(
        ["device", "run", "--config", "d.toml", "--labels", "l.npy"]
    )
    assert serve.config == Path("c.toml") and not serve.keep_running
    assert run.labels == Path("l.npy")


def test_labels_from_npy_and_text(tmp_path: Path) -> None:
    np.save(tmp_path / "l.npy", np.array([0, 3, 3, 9]))
    (tmp_path / "l.csv").write_text("0, 3,3\n9\n")
    for name in ("l.npy", "l.csv"):
        assert cli_service.load_labels(tmp_path / name).tolist() == [0, 3, 3, 9]


def test_bad_label_files_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "f.npy", np.array([0.5, 1.0]))
    (tmp_path / "n.txt").write_text("1 -2")
    with pytest.raises(ValueError, match="integers"):
        cli_service.load_labels(tmp_path / "f.npy")
    with pytest.raises(ValueError, match="non-negative"):
        cli_service.load_labels(tmp_path / "n.txt")


def _model_init(tmp_path: Path, *extra: str) -> int:
    return cli_service.main(
        ["model", "init", "--classes", "10", "--out", str(tmp_path / "w.ursw"), *extra]
    )


def test_model_init_writes_loadable_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_from_bytes, spec_of

    args = ("--input-dim", "64", "--hidden-sizes", "16", "--seed", "3")
    assert _model_init(tmp_path, *args) == 0
    arrays = arrays_from_bytes((tmp_path / "w.ursw").read_bytes())
    options = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}
    expected = initial_arrays("mlp", options, seed=3)
    assert spec_of(arrays) == spec_of(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(arrays[name], value)
    out = capsys.readouterr().out
    assert (
        "model_options = { num_classes = 10, input_dim = 64, hidden_sizes = [16] }"
        in out
    )


def test_model_init_errors_name_the_problem(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _model_init(tmp_path) == 2  # mlp without --input-dim
    assert "--input-dim" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ursa.models.registry", None)  # no torch
    assert _model_init(tmp_path, "--input-dim", "4") == 2
    assert "ursa-fl[train]" in capsys.readouterr().err
    assert not (tmp_path / "w.ursw").exists()


def _coordinator(tmp_path: Path, training: dict[str, Any] | None) -> Any:
    from ursa.coordinator.config import CoordinatorConfig

    return CoordinatorConfig.model_validate(
        {"federation": "f", "state_dir": tmp_path / "c", "training": training}
    )


def test_training_plugin_from_the_section(tmp_path: Path) -> None:
    from ursa.coordinator.training import TrainingPlugin

    assert cli_service.training_plugin(_coordinator(tmp_path, None)) is None
    with pytest.raises(cli_service.ServiceSetupError, match="initial weights"):
        cli_service.training_plugin(_coordinator(tmp_path, {}))
    assert _model_init(tmp_path, "--input-dim", "8") == 0
    section = {"initial_weights": str(tmp_path / "w.ursw"), "weighting": "climb"}
    plugin = cli_service.training_plugin(_coordinator(tmp_path, section))
    assert isinstance(plugin, TrainingPlugin)
    assert plugin.version == 0 and plugin.config.weighting == "climb"
    assert (tmp_path / "c" / "models" / "classifier").is_dir()


def _device(tmp_path: Path, **fields: Any) -> Any:
    from ursa.edge_sdk.config import DeviceConfig

    return DeviceConfig.model_validate(
        {"device_id": "dev001", "federation": "f", "state_dir": tmp_path, **fields}
    )


def test_training_device_gets_a_torch_trainer(tmp_path: Path) -> None:
    from ursa.edge_sdk.torch_trainer import TorchTrainer

    rng = np.random.default_rng(0)
    x, y = rng.random((12, 4)), np.arange(12) % 3
    np.savez(tmp_path / "d.npz", x=x, y=y)
    training: dict[str, Any] = {
        "data_file": str(tmp_path / "d.npz"),
        "model_options": {"input_dim": 4, "num_classes": 3},
        "train": {"epochs": 2},
        "wire_dtype": "float16",
    }
    client = cli_service.build_device(_device(tmp_path, training=training))
    trainer = client._trainer
    assert isinstance(trainer, TorchTrainer)
    assert trainer.num_examples == 12 and trainer.wire_dtype == "float16"
    assert trainer.seed == cli_service.device_seed("dev001")
    assert client._labels.tolist() == y.tolist()
    with pytest.raises(cli_service.ServiceSetupError, match="labels"):
        cli_service.build_device(_device(tmp_path, training=training), Path("l.npy"))
    bad_fields: list[tuple[dict[str, Any], str]] = [
        ({"data_file": str(tmp_path / "none.npz")}, "no such file"),
        ({"model_options": {"input_dim": 4}}, "num_classes"),
        ({"train": {"epochs": 0}}, "epochs"),
    ]
    for bad, match in bad_fields:
        with pytest.raises(cli_service.ServiceSetupError, match=match):
            cli_service.build_device(_device(tmp_path, training={**training, **bad}))


def test_selection_only_device_runs_without_torch(tmp_path: Path) -> None:
    np.save(tmp_path / "l.npy", np.array([0, 1, 1]))
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ursa.edge_sdk.config import DeviceConfig\n"
        "from ursa.tools.cli.service import build_device\n"
        f"root = Path({str(tmp_path)!r})\n"
        "config = DeviceConfig(device_id='dev001', federation='f', state_dir=root,"
        " labels_file=root / 'l.npy')\n"
        "client = build_device(config)\n"
        "assert client._labels.tolist() == [0, 1, 1]\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with pytest.raises(cli_service.ServiceSetupError, match="labels"):
        cli_service.build_device(_device(tmp_path))


def test_model_init_writes_feddisk_made_weights_and_the_matching_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_from_bytes

    out_file = tmp_path / "made.ursw"
    argv = ["model", "init", "--model", "made", "--input-dim", "16", "--seed", "2"]
    assert cli_service.main([*argv, "--out", str(out_file)]) == 0
    arrays = arrays_from_bytes(out_file.read_bytes())
    expected = initial_arrays("made", {"input_dim": 16, "hidden_sizes": [64]}, seed=2)
    assert sorted(arrays) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(arrays[name], value)
    out = capsys.readouterr().out
    assert f'made_initial_weights = "{out_file}"' in out
    assert "feddisk = { made_hidden_sizes = [64] }" in out
    assert cli_service.main(["model", "init", "--out", str(out_file)]) == 2
    assert "--classes" in capsys.readouterr().err


def test_feddisk_section_builds_the_two_phase_plugin(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from ursa.coordinator.feddisk_plugin import FeddiskPlugin

    assert _model_init(tmp_path, "--input-dim", "8") == 0
    made_file = tmp_path / "made.ursw"
    argv = ["model", "init", "--model", "made", "--input-dim", "8"]
    assert cli_service.main([*argv, "--out", str(made_file)]) == 0
    section: dict[str, Any] = {
        "initial_weights": str(tmp_path / "w.ursw"),
        "weighting": "feddisk",
        "feddisk": {"max_made_rounds": 7},
    }
    with pytest.raises(cli_service.ServiceSetupError, match="initial weights"):
        cli_service.training_plugin(_coordinator(tmp_path, section))
    section["made_initial_weights"] = str(made_file)
    plugin = cli_service.training_plugin(_coordinator(tmp_path, section))

    assert isinstance(plugin, FeddiskPlugin)
    assert plugin.phase == "made" and plugin.made_rounds == 0
    assert plugin.made.config.model == "made" and plugin.made.version == 0
    assert plugin.classifier.config.model == "classifier"
    assert plugin.classifier.config.weighting == "fedavg"
    assert (tmp_path / "c" / "models" / "made").is_dir()
    with pytest.raises(ValidationError, match="weighting = 'feddisk'"):
        _coordinator(tmp_path, {**section, "weighting": "climb"})
    with pytest.raises(ValidationError, match="max_made_rounds"):
        _coordinator(tmp_path, {**section, "feddisk": {"max_made_rounds": 0}})


def test_feddisk_device_wraps_its_torch_trainer(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from ursa.edge_sdk.feddisk_trainer import FeddiskTrainer

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.random((12, 4)), y=np.arange(12) % 3)
    training: dict[str, Any] = {
        "data_file": str(tmp_path / "d.npz"),
        "model_options": {"input_dim": 4, "num_classes": 3},
        "feddisk": {"made_hidden_sizes": [8]},
    }
    trainer = cli_service.build_device(_device(tmp_path, training=training))._trainer

    assert isinstance(trainer, FeddiskTrainer)
    assert trainer.phase == "made" and trainer.model == "made"
    with pytest.raises(cli_service.ServiceSetupError, match="feddisk"):
        bad = {**training, "feddisk": {"made_lr": -1.0}}
        cli_service.build_device(_device(tmp_path, training=bad))
    with pytest.raises(ValidationError, match="not both"):
        _device(tmp_path, training={**training, "climb": {}})
