"""The two example device apps (examples/) against a real Mosquitto and coordinator.

Each example's own coordinator and device TOML files are loaded (only the
broker, the state directories and the fleet size change), its data helper
writes the device files, its app builds the devices, and the coordinator
named by its ``[training] architecture`` runs two rounds.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.config import load_coordinator_config
from ursa.edge_sdk.config import load_device_config
from ursa.models.weights import Arrays, arrays_from_bytes
from ursa.tools.compose import RoundHooks, TrainingHooks, build_coordinator

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
N, K, ROUNDS = 3, 2, 2


def run_example(
    fed_factory: Any,
    folder: Path,
    app: Any,
    data_files: list[Path],
    accuracy: Callable[[Arrays], float],
    *,
    training: str = "fedavg",
    rounds: int = ROUNDS,
) -> tuple[list[Any], list[float], Arrays]:
    """Run the example's coordinator and N app devices for ROUNDS rounds.

    ``training`` replaces the TOMLs' training method (both sides).
    """
    configs = data_files[0].parent / f"configs-{training}"
    configs.mkdir(exist_ok=True)
    for name in ("coordinator.toml", "device.toml"):
        text = (folder / name).read_text()
        text = text.replace('kind = "fedavg"', f'kind = "{training}"')
        (configs / name).write_text(text)
    base = load_coordinator_config(configs / "coordinator.toml", environ={})
    fed = fed_factory(base.federation)
    records: list[Any] = []
    scores: list[float] = []

    def score(round_index: int, version: int, arrays: Arrays) -> Mapping[str, float]:
        scores.append(accuracy(arrays))
        return {"accuracy": scores[-1]}

    config = fed.coordinator_config(
        N, k=K, tries=3, rounds=rounds, methods=base.methods, training=base.training
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    hooks = TrainingHooks(
        classifier=RoundHooks(evaluate=score, on_round=records.append)
    )
    service = build_coordinator(config, hooks=hooks)
    initial = arrays_from_bytes(
        (config.state_dir / "initial-classifier.ursw").read_bytes()
    )
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    device_toml = load_device_config(configs / "device.toml", environ={})
    stop = threading.Event()
    threads = []
    for index, device_id in enumerate(fed.device_ids(N)):
        ours = fed.device_config(device_id)
        config_i = device_toml.model_copy(
            update={
                "device_id": device_id,
                "state_dir": ours.state_dir,
                "broker": ours.broker,
                "obfuscator_pool_size": 2,
            }
        )
        client = app.build_client(config_i, data_files[index], seed=index)
        fed.clients[device_id] = client
        thread = threading.Thread(
            target=client.run, args=(stop,), kwargs={"poll_s": 0.5}, daemon=True
        )
        thread.start()
        threads.append(thread)
    try:
        deadline = time.monotonic() + 120
        while not service.is_done and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        service.stop()
        loop.join(5)
        for thread in threads:
            thread.join(5)
    assert service.is_done, f"rounds done: {[r.round for r in records]}"
    return records, [accuracy(initial), *scores], initial


def test_the_torch_cnn_example_trains_its_batchnorm_model(
    mqtt_federation: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    folder = EXAMPLES / "torch_cnn"
    monkeypatch.syspath_prepend(str(folder))
    data = importlib.import_module("cnn_data")
    app = importlib.import_module("cnn_app")
    model = importlib.import_module("digits_cnn")
    data.write(tmp_path / "data", N, per_device=150)
    x_test, y_test = data.read(tmp_path / "data" / "test.npz")

    def accuracy(arrays: Arrays) -> float:
        from ursa.models.registry import load_arrays

        net = model.build(**model.MODEL_OPTIONS)
        load_arrays(net, arrays)
        net.eval()
        with torch.no_grad():
            predicted = net(torch.from_numpy(x_test)).argmax(dim=1).numpy()
        return float((predicted == y_test).mean())

    files = [tmp_path / "data" / f"device-{i}.npz" for i in range(N)]
    records, scores, initial = run_example(
        mqtt_federation, folder, app, files, accuracy
    )

    assert [r.round for r in records] == list(range(1, ROUNDS + 1))
    assert all(len(r.contributed) == K for r in records)
    assert scores[-1] > scores[0] + 0.15, scores
    final = arrays_from_bytes(
        (
            tmp_path / "coordinator" / "models" / "classifier" / "v000002.ursw"
        ).read_bytes()
    )
    assert not np.allclose(final["features.1.running_mean"], 0.0)  # averaged
    assert final["features.1.num_batches_tracked"].dtype == np.int64
    assert int(final["features.1.num_batches_tracked"]) == int(
        initial["features.1.num_batches_tracked"]
    )  # the coordinator's counter is kept


@pytest.mark.parametrize("training", ["fedavg", "climb"])
def test_the_numpy_example_trains_without_torch(
    mqtt_federation: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    training: str,
) -> None:
    folder = EXAMPLES / "numpy_softmax"
    monkeypatch.syspath_prepend(str(folder))
    data = importlib.import_module("softmax_data")
    app = importlib.import_module("softmax_app")
    model = importlib.import_module("softmax_model")
    data.write(tmp_path / "data", N, per_device=150)
    x_test, y_test = data.read(tmp_path / "data" / "test.csv")
    judge = model.SoftmaxTrainer(x_test, y_test)

    def accuracy(arrays: Arrays) -> float:
        return float(judge.evaluate([arrays["0"], arrays["1"]])["accuracy"])

    files = [tmp_path / "data" / f"device-{i}.csv" for i in range(N)]
    plans: list[Any] = []
    fit = model.SoftmaxTrainer.fit

    def recording_fit(self: Any, weights: Any, plan: Any) -> Any:
        plans.append(plan)
        return fit(self, weights, plan)

    monkeypatch.setattr(model.SoftmaxTrainer, "fit", recording_fit)
    # CLIMB's w_i differ from 1 from round 3 on: round 1's losses at the
    # all-zero model are equal, and w_i of round r uses the lambdas of r - 1
    rounds = 3 if training == "climb" else ROUNDS
    records, scores, _ = run_example(
        mqtt_federation, folder, app, files, accuracy, training=training, rounds=rounds
    )

    assert [r.round for r in records] == list(range(1, rounds + 1))
    assert all(len(r.contributed) == K for r in records)
    assert scores[-1] > scores[0] + 0.15, scores
    assert len(plans) == K * rounds and {p.epochs for p in plans} == {2}
    weights = {round(p.client_weight, 6) for p in plans}
    if training == "climb":  # the dual step's w_i reached the app's plan
        assert weights != {1.0}, weights
        assert all(r.before_training == {"climb": N} for r in records)
    else:
        assert weights == {1.0}


def test_the_numpy_example_app_and_its_coordinator_model_load_no_torch(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; import softmax_app, softmax_data; "
        "from ursa.models.reference import reference_arrays; "
        "from ursa.tools.compose import coordinator_initial_weights; "
        "a = reference_arrays('softmax_model:initial_weights', "
        "{'features': 64, 'classes': 10}); "
        "assert [v.shape for v in a.values()] == [(64, 10), (10,)]; "
        "assert 'torch' not in sys.modules, 'torch loaded'"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=EXAMPLES / "numpy_softmax"
    )
