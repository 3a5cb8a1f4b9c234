"""FLICKER inside the ordinary service over a real Mosquitto (password file + ACL).

One federation, one session per device: dubhe + climb + flicker trains after
FLICKER balanced the devices' images; and a coordinator ``kill -9``-ed in
FLICKER's correction loop resumes the same run from its store.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sqlite3
import subprocess
import threading
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods.climb import ClimbDualStep
from ursa.coordinator.methods_config import ClimbSpec, DubheSpec, FlickerSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.store import DB_FILENAME
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk import methods_config as device_methods

from .conftest import polling, serve_coordinator

pytestmark = pytest.mark.integration
pytest.importorskip("tenseal")

MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [32]}


def test_dubhe_climb_flicker_trains_after_flicker_balanced_the_images(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    from ursa.edge_sdk.methods.flicker.method import Flicker
    from ursa.edge_sdk.methods.flicker.resampling import CentroidFeatures
    from ursa.edge_sdk.torch_trainer import TorchTrainer
    from ursa.edge_sdk.training import TrainConfig, evaluate
    from ursa.models.registry import initial_arrays
    from ursa.models.weights import arrays_to_bytes
    from ursa.tools.data.loaders import load_digits

    n, k, rounds = 5, 3, 2
    fed = mqtt_federation("flkfed")
    data = load_digits()
    x, y = data.flat(), data.y
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    test, aux, pool = order[:300], order[300:500], order[500:]
    parts: list[list[int]] = [[] for _ in range(n)]
    for c in range(10):  # long-tailed classes: GI about 1/11, below nabla
        kept = pool[y[pool] == c][: max(12, int(130 * 12 ** (-c / 9)))]
        for j, index in enumerate(kept):
            if j < 2 * n:  # two of every class on every device
                device = j % n
            elif rng.random() < 0.6:  # most of the rest on one device
                device = c % n
            else:
                device = int(rng.integers(n))
            parts[device].append(int(index))
    extractor = CentroidFeatures.fit(x[aux].reshape(-1, 8, 8), y[aux], 10)
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(initial_arrays("mlp", MODEL, seed=0)))
    scores: list[float] = []

    def score(round_index: int, version: int, arrays: Any) -> dict[str, float]:
        accuracy = evaluate("mlp", MODEL, arrays, x[test], y[test]).accuracy
        scores.append(accuracy)
        return {"accuracy": accuracy}

    methods = (DubheSpec(), ClimbSpec(), FlickerSpec(reply_deadline_s=60.0))
    config = fed.coordinator_config(n, k=k, tries=3, rounds=rounds, methods=methods)
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    build = partial(
        TrainingPlugin,
        federation="flkfed",
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=30),
        initial_weights=initial,
        evaluate=score,
    )
    service = CoordinatorService(
        config,
        plugin=build,
        steps=[ClimbDualStep.later(ClimbSpec(dual_timeout_s=15))],
    )
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    clients = []
    device_list = (
        device_methods.DubheDeviceSpec(),
        device_methods.ClimbDeviceSpec(),
        device_methods.FlickerDeviceSpec(num_classes=10),
    )
    for i, device_id in enumerate(fed.device_ids(n)):
        xs, ys = x[np.array(parts[i])], y[np.array(parts[i])]
        trainer = TorchTrainer(
            xs,
            ys,
            model_config=MODEL,
            train=TrainConfig(epochs=2, batch_size=8, lr=0.1),
            seed=i,
        )
        flicker = functools.partial(
            Flicker,
            spec=device_list[2],
            labels=ys,
            x=xs,
            extractor=extractor,
            rng=np.random.default_rng([i, 5]),
        )
        client = fed.start_device(
            device_id,
            ys,
            seed=i,
            trainer=trainer,
            method_specs=device_list,
            methods=[flicker],
        )
        clients.append(client)
    try:
        with polling(clients):
            fed.capture.wait_for(lambda: service.is_done, 240, "rounds after FLICKER")
    finally:
        service.stop()
        loop.join(5)

    flicker_method = service.balancing
    assert flicker_method is not None
    summary = flicker_method.summary()
    assert summary["phase"] == "done", summary
    assert summary["resampled_devices"], flicker_method.outcome()
    assert summary["gi_after"] > summary["gi_before"]
    kinds = [m.kind for _, m in fed.capture.messages("ring_start")]
    assert kinds, "no ring over the broker"
    first_epoch = fed.capture.messages("key_epoch_start")[0][1]
    assert first_epoch.methods == ("dubhe", "climb", "flicker")
    resampled = [fed.clients[d] for d in summary["resampled_devices"]]
    for client in resampled:
        trainer = client.data.trainer
        assert isinstance(trainer, TorchTrainer)
        counts = np.bincount(trainer.y, minlength=10)
        participant = client.method(Flicker).participant
        assert participant is not None
        assert tuple(int(c) for c in counts) == participant.counts
        assert np.array_equal(trainer.y, client.data.labels)
    assert plugin.version == rounds
    assert all(len(r.contributed) == k for r in plugin.history)
    assert len(scores) == rounds and max(scores) > 0.1, scores  # above chance


def test_coordinator_killed_in_flickers_loop_resumes_the_same_run(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    n, rounds = 6, 2
    fed = mqtt_federation("flkkill")
    base = fed.coordinator_config(n, rounds=rounds)
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(
        f'federation = "flkkill"\nstate_dir = "{base.state_dir}"\n'
        f"min_devices = {n}\nk = 2\ntries = 2\nrounds = {rounds}\n"
        f"key_bits = {base.key_bits}\ninsecure_test_keys = true\n"
        '[[methods]]\nkind = "dubhe"\n'
        '[[methods]]\nkind = "flicker"\nreply_deadline_s = 20.0\n'
        f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
        '[enrolment]\nmode = "tofu"\n'
        "[deadlines]\nvolunteer_s = 5\ndistributions_s = 5\nagent_s = 5\n"
    )
    env = dict(os.environ, URSA_BROKER__PASSWORD=fed.broker.credentials["coordinator"])
    log_path = tmp_path / "coordinator.log"

    def spawn() -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = serve_coordinator(config_file, env, log_path)
        return process

    process = spawn()
    killed = threading.Event()

    def kill_at_a_resample_request(topic: str, message: Any) -> None:
        if message.kind == "resample_request" and not killed.is_set():
            killed.set()
            os.kill(process.pid, signal.SIGKILL)

    fed.capture.on_message = kill_at_a_resample_request
    methods = (device_methods.DubheDeviceSpec(), device_methods.FlickerDeviceSpec())
    try:
        for i, device_id in enumerate(fed.device_ids(n)):
            fed.start_device(device_id, _skewed(i), seed=i, method_specs=methods)
        fed.capture.wait_for(killed.is_set, 120, "a resample request")
        process.wait(timeout=10)
        assert process.returncode == -signal.SIGKILL
        db = base.state_dir / DB_FILENAME
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            row = conn.execute(
                "SELECT value FROM method_state WHERE method='flicker' AND key='run'"
            ).fetchone()
            state = json.loads(
                conn.execute("SELECT value FROM meta WHERE key='state'").fetchone()[0]
            )
        assert state["stage"] == "balancing"
        assert json.loads(row[0])["phase"] in ("localise", "resample")

        process = spawn()
        assert process.wait(timeout=180) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        run = json.loads(
            conn.execute(
                "SELECT value FROM method_state WHERE method='flicker' AND key='run'"
            ).fetchone()[0]
        )
        completed = [
            r[0] for r in conn.execute("SELECT round FROM rounds WHERE completed=1")
        ]
    assert run["phase"] == "done"
    assert completed == list(range(1, rounds + 1))
    ring_ids = {m.ring_id for _, m in fed.capture.messages("ring_start")}
    assert len(ring_ids) == 1, "the run resumed; it did not start again"
    assert len(fed.capture.messages("enrol_result")) == n  # nobody enrolled again
    assert {m.epoch for _, m in fed.capture.messages("key_epoch_start")} == {1}
    log_text = log_path.read_text()
    assert "FLICKER: resumed a run" in log_text
    assert (base.state_dir / "ckks.key").stat().st_mode & 0o777 == 0o600


def _skewed(index: int) -> np.ndarray:
    """One dominant class per device, a few of every class: GI below nabla."""
    main = index % 10
    return np.concatenate(
        [np.full(200, main), np.full(10, (main + 1) % 10), np.arange(10).repeat(3)]
    )
