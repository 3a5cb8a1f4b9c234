"""`ursa coordinator serve` + `ursa device run` with ``[training]``, over Mosquitto.

The coordinator is the real CLI in a subprocess, initial weights from
`ursa model init`; one device is `ursa device run` in a subprocess, three are
EdgeClients built in-process by the same `build_device` the command uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.model_store import ModelStore
from ursa.edge_sdk.config import load_device_config
from ursa.tools import compose
from ursa.tools.data.loaders import load_digits

pytestmark = pytest.mark.integration

N, K, ROUNDS = 4, 3, 2
SAMPLES = 60
DUBHE = '[[methods]]\nkind = "dubhe"\n'
RANDOM_FEDAVG = '[[methods]]\nkind = "random"\n[[methods]]\nkind = "fedavg"\n'
CLIMB_DEVICE = DUBHE + '[[methods]]\nkind = "climb"\neta_d = 0.1\n'
FEDDISK_DEVICE = DUBHE + (
    '[[methods]]\nkind = "feddisk"\nlocal_made_max_epochs = 10\nclassifier_epochs = 3\n'
)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ursa.tools.cli.service", *args]


def _coordinator_toml(
    fed: Any,
    state_dir: Path,
    weights: Path,
    rounds: int = ROUNDS,
    training: str = '[[methods]]\nkind = "climb"\ndual_timeout_s = 15\n',
    selection: str = DUBHE,
) -> str:
    return (
        f'federation = "{fed.federation}"\nstate_dir = "{state_dir}"\n'
        f"min_devices = {N}\nk = {K}\ntries = 2\nrounds = {rounds}\n"
        "key_bits = 512\ninsecure_test_keys = true\nseed = 3\n"
        f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
        '[enrolment]\nmode = "tofu"\n'
        "[deadlines]\nvolunteer_s = 5\ndistributions_s = 5\nagent_s = 5\n"
        "training_s = 60\n"
        f'[training]\ninitial_weights = "{weights}"\nupdate_timeout_s = 30\n'
        'architecture = "mlp"\n'
        "model_options = { input_dim = 64, num_classes = 10, hidden_sizes = [16] }\n"
        + selection
        + training
    )


def _device_toml(
    fed: Any, device_id: str, root: Path, data: Path, weighting: str = CLIMB_DEVICE
) -> str:
    return (
        f'device_id = "{device_id}"\nfederation = "{fed.federation}"\n'
        f'state_dir = "{root / device_id}"\nobfuscator_pool_size = 2\n'
        "insecure_test_keys = true\n"
        f'[broker]\nurl = "{fed.url}"\nusername = "{device_id}"\nkeepalive_s = 5\n'
        f'[training]\ndata_file = "{data}"\n'
        "model_options = { input_dim = 64, num_classes = 10, hidden_sizes = [16] }\n"
        'wire_dtype = "float16"\ntrain = { epochs = 1, batch_size = 8, lr = 0.1 }\n'
        + weighting
    )


def _model_init(weights: Path) -> None:
    init = _cli(
        "model", "init", "--classes", "10", "--input-dim", "64",
        "--hidden-sizes", "16", "--out", str(weights),
    )  # fmt: skip
    subprocess.run(init, check=True, timeout=60, capture_output=True)


def test_serve_and_device_run_train_two_climb_rounds(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("servetrain")
    weights = tmp_path / "initial.ursw"
    _model_init(weights)
    state_dir = tmp_path / "coordinator"
    _serve_and_run(
        fed, tmp_path, _coordinator_toml(fed, state_dir, weights), CLIMB_DEVICE
    )

    store = ModelStore(state_dir, "classifier")
    latest = store.latest()
    assert latest is not None and latest.version == ROUNDS
    checkpoints = sorted(p.name for p in store.path.glob("v*.ursw"))
    assert checkpoints == [f"v{v:06d}.ursw" for v in range(ROUNDS + 1)]
    selected = {
        m.round: set(m.selected) for _, m in fed.capture.messages("selection_result")
    }
    assert sorted(selected) == list(range(1, ROUNDS + 1))
    updates: dict[int, set[str]] = {}
    for _, update in fed.capture.messages("masked_update"):
        assert update.base_version == update.round - 1
        updates.setdefault(update.round, set()).add(update.sender)
    assert updates == selected  # every selected device trained and uploaded
    reports = fed.capture.messages("mean_report")
    assert {m.purpose for _, m in reports} == {"climb.dual"}, "no CLIMB dual step ran"
    hellos = {m.sender for _, m in fed.capture.messages("hello")}
    assert hellos == set(fed.device_ids(N))  # the `ursa device run` device too
    final = state_dir / "final"  # the coordinator's final model, checked ONNX
    card = json.loads((final / "model_card.json").read_text())
    assert card["version"] == ROUNDS and card["rounds"] == ROUNDS
    assert card["architecture"]["input_shape"] == [64]
    assert card["onnx_check"]["identical"] is True
    assert (final / "model.onnx").is_file() and (final / "model.ursw").is_file()


def test_serve_and_device_run_feddisk_made_then_classifier(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("servedisk")
    weights, made = tmp_path / "initial.ursw", tmp_path / "made.ursw"
    _model_init(weights)
    init = _cli("model", "init", "--model", "made", "--input-dim", "64")
    subprocess.run(
        [*init, "--out", str(made)], check=True, timeout=60, capture_output=True
    )
    state_dir = tmp_path / "coordinator"
    feddisk = (
        f'[[methods]]\nkind = "feddisk"\nmade_initial_weights = "{made}"\n'
        "max_made_rounds = 1\n"
    )
    toml = _coordinator_toml(fed, state_dir, weights, 1 + ROUNDS, feddisk)
    _serve_and_run(fed, tmp_path, toml, FEDDISK_DEVICE)

    made_latest = ModelStore(state_dir, "made").latest()
    assert made_latest is not None and made_latest.version == 1  # the round cap
    latest = ModelStore(state_dir, "classifier").latest()
    assert latest is not None and latest.version == ROUNDS
    (_, switch), *_again = fed.capture.messages("feddisk_switch")
    assert (switch.round, switch.made_version) == (2, 1)
    sums = fed.capture.messages("mean_sum")
    assert [(m.purpose, m.round, m.num_parties) for _, m in sums] == [
        ("feddisk.made_loss", 2, N)
    ]
    for _, update in fed.capture.messages("masked_update"):
        made_round = update.round == 1
        assert update.model == ("made" if made_round else "classifier")
        assert update.base_version == (0 if made_round else update.round - 2)
    reports = fed.capture.messages("mean_report")
    assert {m.purpose for _, m in reports} == {"feddisk.made_loss"}  # no CLIMB


def test_serve_and_device_run_random_selection_with_fedavg(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("serverandom")
    weights = tmp_path / "initial.ursw"
    _model_init(weights)
    state_dir = tmp_path / "coordinator"
    toml = _coordinator_toml(
        fed, state_dir, weights, training="", selection=RANDOM_FEDAVG
    )
    _serve_and_run(fed, tmp_path, toml, RANDOM_FEDAVG)

    latest = ModelStore(state_dir, "classifier").latest()
    assert latest is not None and latest.version == ROUNDS
    (_, notice), *_ = fed.capture.messages("key_epoch_start")
    assert notice.methods == ("random", "fedavg")
    results = [m for _, m in fed.capture.messages("selection_result")]
    assert sorted({r.round for r in results}) == list(range(1, ROUNDS + 1))
    assert all(len(set(r.selected)) == K and r.try_index is None for r in results)
    updates: dict[int, set[str]] = {}
    for _, update in fed.capture.messages("masked_update"):
        updates.setdefault(update.round, set()).add(update.sender)
    assert updates == {r.round: set(r.selected) for r in results}
    assert not fed.capture.messages("volunteer")  # nothing of Dubhe ran
    assert not fed.capture.messages("mean_report")  # no encrypted mean


def _serve_and_run(
    fed: Any, tmp_path: Path, coordinator_text: str, device_weighting: str
) -> None:
    """Serve in a subprocess, one `device run` subprocess, the rest in-process."""
    digits = load_digits()
    x, y = digits.flat(), digits.y
    order = np.argsort(y, kind="stable")  # skewed: consecutive classes per device
    configs = []
    for i, device_id in enumerate(fed.device_ids(N)):
        part = order[i * len(y) // N :][:SAMPLES]
        data = tmp_path / f"{device_id}.npz"
        np.savez(data, x=x[part], y=y[part])
        path = tmp_path / f"{device_id}.toml"
        path.write_text(_device_toml(fed, device_id, tmp_path, data, device_weighting))
        configs.append((device_id, path))

    coordinator_toml = tmp_path / "coordinator.toml"
    coordinator_toml.write_text(coordinator_text)
    password = fed.broker.credentials
    log_path = tmp_path / "processes.log"
    processes: list[subprocess.Popen[bytes]] = []
    with log_path.open("ab") as log:
        coordinator = subprocess.Popen(
            _cli("coordinator", "serve", "--config", str(coordinator_toml)),
            env=dict(os.environ, URSA_BROKER__PASSWORD=password["coordinator"]),
            stdout=log,
            stderr=log,
        )
        processes.append(coordinator)
        last_id, last_path = configs[-1]
        device = subprocess.Popen(
            _cli("device", "run", "--config", str(last_path)),
            env=dict(os.environ, URSA_BROKER__PASSWORD=password[last_id]),
            stdout=log,
            stderr=log,
        )
        processes.append(device)
    try:
        for device_id, path in configs[:-1]:
            env = {"URSA_BROKER__PASSWORD": password[device_id]}
            client = compose.build_device(load_device_config(path, env))
            fed.clients[device_id] = client  # stopped by the fixture
            client.start()
        assert coordinator.wait(timeout=120) == 0, log_path.read_text()[-3000:]
        # the end of the federation stops `ursa device run` with exit code 0
        assert device.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        final = tmp_path / last_id / "final"
        assert (final / "model.ursw").is_file()
        assert (final / "model.onnx").is_file()  # the [train] and [infer] extras
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
