"""`ursa coordinator serve` / `ursa device run` / `ursa model init`: setup."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from ursa.edge_sdk.methods.feddisk.settings import FeddiskSettings
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


def test_model_init_writes_feddisk_made_weights_and_the_matching_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_from_bytes

    out_file = tmp_path / "made.ursw"
    argv = ["model", "init", "--model", "made", "--input-dim", "16", "--seed", "2"]
    assert cli_service.main([*argv, "--out", str(out_file)]) == 0
    arrays = arrays_from_bytes(out_file.read_bytes())
    devices = FeddiskSettings()  # the devices' default MADE, which the weights fit
    expected = initial_arrays("made", devices.made_model_config(16), seed=2)
    assert sorted(arrays) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(arrays[name], value)
    out = capsys.readouterr().out
    assert f'made_initial_weights = "{out_file}"' in out
    hidden = list(devices.made_hidden_sizes)
    assert f'kind = "feddisk"\nmade_hidden_sizes = {hidden}' in out
    assert cli_service.main(["model", "init", "--out", str(out_file)]) == 2
    assert "--classes" in capsys.readouterr().err


def test_device_repin_forgets_the_coordinator_and_its_run_but_keeps_the_identity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ursa.crypto.identity import DeviceIdentity
    from ursa.edge_sdk.state_dir import DeviceStateDir

    state_dir = tmp_path / "d1"
    identity = DeviceIdentity.load_or_create(state_dir, "d1")
    state = DeviceStateDir(state_dir)
    old = DeviceIdentity.generate("coordinator").public()
    state.save_coordinator(old)
    for name in ("epoch.json", "epoch-3.key", "draws.json", "methods.json", "run.json"):
        (state_dir / name).write_text("{}")
    config = tmp_path / "d1.toml"
    config.write_text(
        f'device_id = "d1"\nfederation = "f"\nstate_dir = "{state_dir}"\n'
    )

    assert cli_service.main(["device", "repin", "--config", str(config)]) == 0

    out = capsys.readouterr().out
    assert f"forgot coordinator {old.fingerprint()}" in out
    assert state.load_coordinator() is None
    assert sorted(p.name for p in state_dir.iterdir()) == ["identity.key"]
    again = DeviceIdentity.load_or_create(state_dir, "d1")
    assert again.public() == identity.public()
    assert cli_service.main(["device", "repin", "--config", str(config)]) == 0
    assert "no coordinator was pinned" in capsys.readouterr().out


def test_model_init_builds_a_model_named_by_import_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ursa.models.weights import arrays_from_bytes

    out_file = tmp_path / "np.ursw"
    argv = ["model", "init", "--model", "tests.models.spec_factories:softmax"]
    options = ["--options", '{"features": 4, "classes": 3}']
    assert cli_service.main([*argv, *options, "--out", str(out_file)]) == 0
    arrays = arrays_from_bytes(out_file.read_bytes())
    assert [(k, v.shape) for k, v in arrays.items()] == [("0", (4, 3)), ("1", (3,))]
    printed = capsys.readouterr().out
    assert 'architecture = "tests.models.spec_factories:softmax"' in printed
    assert "model_options = { features = 4, classes = 3 }" in printed
    assert cli_service.main([*argv, "--out", str(out_file)]) == 2  # no options
    assert "failed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_service.main(["model", "init", "--model", "resnet", "--out", "x"])


def test_device_run_takes_sigterm_before_its_start_up(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("-1")
    config = tmp_path / "d1.toml"
    config.write_text(
        f'device_id = "d1"\nfederation = "f"\nstate_dir = "{tmp_path / "d1"}"\n'
        f'labels_file = "{labels}"\n'
    )
    before = signal.getsignal(signal.SIGTERM)
    try:
        # start-up fails here (no labels), after the handler is in place: a
        # SIGTERM while a device loads torch and its data stops it cleanly
        assert cli_service.main(["device", "run", "--config", str(config)]) == 2
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, before)
    finally:
        signal.signal(signal.SIGTERM, before)


def test_serve_refuses_keys_under_2048_bits_without_the_test_switch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "coordinator.toml"
    base = f'federation = "f"\nstate_dir = "{tmp_path / "c"}"\nkey_bits = 1024\n'
    config.write_text(base)
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert cli_service.main(["coordinator", "serve", "--config", str(config)]) == 2
    finally:
        signal.signal(signal.SIGTERM, before)
    err = capsys.readouterr().err
    assert "key_bits = 1024 is below 2048" in err and "insecure_test_keys" in err
    assert not (tmp_path / "c").exists()  # refused before anything started


def test_sigterm_logs_stopping_then_stopped(caplog: pytest.LogCaptureFixture) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    caplog.set_level(logging.INFO, logger="ursa.cli")
    try:
        stop, watcher = cli_service._stop_on_signals("coordinator")
        signal.raise_signal(signal.SIGTERM)  # what `systemctl stop` sends
        assert stop.wait(5)
        cli_service._stopped(stop, watcher, "coordinator: stopped")
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    lines = [r.message for r in caplog.records]
    assert lines == ["coordinator: stopping (SIGTERM)", "coordinator: stopped"]
