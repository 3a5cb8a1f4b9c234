"""The operator's HTTP view during a real training federation over Mosquitto.

`/metrics` is scraped while rounds run (the values must move), `/api/status`
is read, and headless Chromium renders the dashboard against the live
coordinator: the charts must hold real points, and a screenshot is saved in
the test's output folder (``tmp_path / "dashboard.png"``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ursa.coordinator.config import TrainingSection
from ursa.coordinator.methods_config import DubheSpec, FedAvgSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.telemetry import Telemetry
from ursa.coordinator.training import TrainingRoundReport
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.training import TrainConfig, evaluate
from ursa.models.registry import initial_arrays
from ursa.models.weights import arrays_to_bytes
from ursa.tools.compose import (
    RoundHooks,
    TrainingHooks,
    before_training_steps,
    training_plugin,
)
from ursa.tools.data.loaders import load_digits
from ursa.tools.data.metrics import distance_to_uniform
from ursa.tools.observe.server import observe_service

from .conftest import polling

pytestmark = pytest.mark.integration

N, K, ROUNDS = 5, 3, 3
MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def _metrics(url: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(_get(url + "metrics").decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _chromium(url: str, out: Path, *mode: str) -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (.ci/setup installs Debian's)")
    command = [
        binary,
        "--headless",
        "--no-sandbox",  # root in CI containers
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={out / 'chromium-profile'}",
        "--hide-scrollbars",
        "--window-size=1400,1400",
        "--virtual-time-budget=8000",
        *mode,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_metrics_status_and_dashboard_follow_a_live_federation(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("observe")
    data = load_digits()
    x, y = data.flat(), data.y
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:300], order[300:]
    parts = np.array_split(train[np.argsort(y[train], kind="stable")], N)
    dists = np.array([np.bincount(y[p], minlength=10) / len(p) for p in parts])
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(initial_arrays("mlp", MODEL, seed=0)))
    telemetry = Telemetry()

    def score(round_index: int, version: int, arrays: Any) -> dict[str, Any]:
        result = evaluate("mlp", MODEL, arrays, x[test], y[test])
        return {
            "accuracy": result.accuracy,
            "per_class_accuracy": list(result.per_class_accuracy),
        }

    def on_round(record: TrainingRoundReport) -> None:  # what the demo's harness does
        chosen = [int(d[len("dev") :]) for d in record.selected]
        l1 = float(distance_to_uniform(dists[chosen].mean(axis=0)))
        telemetry.annotate_round(record.round, l1_to_uniform=l1)

    config = fed.coordinator_config(
        N,
        k=K,
        tries=2,
        rounds=ROUNDS,
        methods=(DubheSpec(), FedAvgSpec()),
        training=TrainingSection.model_validate(
            {"initial_weights": initial, "update_timeout_s": 30}
        ),
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    hooks = TrainingHooks(classifier=RoundHooks(score, on_round))
    service = CoordinatorService(
        config,
        plugin=training_plugin(config, hooks, telemetry),
        steps=before_training_steps(config),
        telemetry=telemetry,
    )
    view = observe_service(service, "127.0.0.1:0")
    url = view.url
    before = _metrics(url)
    assert _value(before, "ursa_round") == 0
    assert _value(before, "ursa_devices_enrolled") == 0

    stop = threading.Event()
    service.start()
    loop = threading.Thread(
        target=service.run, args=(stop,), kwargs={"until_done": False}, daemon=True
    )
    loop.start()
    clients = []
    for i, device_id in enumerate(fed.device_ids(N)):
        trainer = TorchTrainer(
            x[parts[i]],
            y[parts[i]],
            model_config=MODEL,
            train=TrainConfig(epochs=1, batch_size=8, lr=0.1),
            seed=i,
        )
        clients.append(
            fed.start_device(device_id, y[parts[i]], seed=i, trainer=trainer)
        )
    try:
        with polling(clients):
            _wait(
                lambda: _value(_metrics(url), "ursa_rounds_completed") >= 1,
                90,
                "round 1 in /metrics",
            )
            during = _metrics(url)
            _wait(lambda: service.is_done, 120, "every round")
            after = _metrics(url)
            status = json.loads(_get(url + "api/status"))
            dom = _chromium(url, tmp_path, "--dump-dom")
            shot = tmp_path / "dashboard.png"
            _chromium(url, tmp_path, f"--screenshot={shot}")
    finally:
        stop.set()
        loop.join(10)
        view.stop()

    # /metrics moved with the federation
    assert 1 <= _value(during, "ursa_round") <= _value(after, "ursa_round") == ROUNDS
    assert _value(after, "ursa_rounds_completed") == ROUNDS
    assert _value(after, "ursa_devices_enrolled") == N
    assert _value(after, "ursa_devices_online") == N
    assert _value(after, "ursa_updates_total") == K * ROUNDS
    hello = _value(after, "ursa_messages_total", kind="hello", direction="in")
    assert hello >= N
    updates_in = {
        _value(m, "ursa_messages_total", kind="masked_update", direction="in")
        for m in (during, after)
    }
    assert min(updates_in) >= K and max(updates_in) >= K * ROUNDS
    for direction in ("in", "out"):
        moved = _value(during, "ursa_bytes_total", direction=direction)
        assert 0 < moved < _value(after, "ursa_bytes_total", direction=direction)
    assert _value(after, "ursa_round_duration_seconds_count") == ROUNDS
    assert 0 < _value(after, "ursa_accuracy", source="server") <= 1
    assert _value(after, "ursa_crypto_seconds_total") > 0
    assert _value(after, "ursa_broker_connected") == 1

    # /api/status: the same run, with the harness's figures
    assert status["rounds_completed"] == ROUNDS and status["devices"]["online"] == N
    rounds = status["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    assert all(len(r["per_class_accuracy"]) == 10 for r in rounds)
    assert all(0 <= r["l1_to_uniform"] <= 2 for r in rounds)
    assert all(r["bytes_received"] > 0 and r["elapsed_s"] > 0 for r in rounds)

    # the page rendered real data: every chart has points, every device a row
    assert 'data-state="ready"' in dom, dom[:2000]
    points = dict(
        re.findall(r'<canvas id="chart-([a-z0-9]+)"[^>]*data-points="(\d+)"', dom)
    )
    assert set(points) == {"accuracy", "l1", "traffic", "time"}, points
    assert int(points["accuracy"]) == 11 * ROUNDS  # 10 classes + overall
    assert int(points["l1"]) == ROUNDS
    assert all(int(p) > 0 for p in points.values()), points
    for device_id in fed.device_ids(N):
        assert f"<td>{device_id}</td>" in dom
    assert shot.stat().st_size > 10_000
    print(f"dashboard screenshot: {shot}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_coordinator_serve_http_serves_metrics_that_move(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("servehttp")
    rounds, n = 4, 6
    base = fed.coordinator_config(n, rounds=rounds)
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(
        f'federation = "servehttp"\nstate_dir = "{base.state_dir}"\n'
        f"min_devices = {n}\nk = 3\ntries = 2\nrounds = {rounds}\n"
        f"key_bits = {base.key_bits}\ninsecure_test_keys = true\n"
        f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
        '[enrolment]\nmode = "tofu"\n'
        "[deadlines]\nvolunteer_s = 5\ndistributions_s = 5\nagent_s = 5\n"
    )
    env = dict(
        os.environ,
        URSA_BROKER__PASSWORD=fed.broker.credentials["coordinator"],
        URSA_HTTP__TOKEN="t0ken-from-env",
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    log_path = tmp_path / "coordinator.log"
    command = [
        sys.executable, "-m", "ursa.tools.cli", "--log-format", "json",
        "coordinator", "serve", "--config", str(config_file), "--keep-running",
        "--http", f"127.0.0.1:{port}",
    ]  # fmt: skip
    seen: list[Samples] = []

    def scrape() -> Samples:
        request = urllib.request.Request(
            url + "metrics", headers={"Authorization": "Bearer t0ken-from-env"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        samples: Samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        seen.append(samples)
        return samples

    with log_path.open("ab") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    try:
        _wait(lambda: _reachable(url), 30, "the HTTP view")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "metrics", timeout=10)  # no token
        with refused.value:
            assert refused.value.code == 401
        first = scrape()
        fed.start_devices(n)
        _wait(
            lambda: _value(scrape(), "ursa_rounds_completed") >= rounds,
            90,
            f"{rounds} rounds in /metrics",
        )
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, log_path.read_text()[-3000:]

    last = seen[-1]
    assert _value(first, "ursa_devices_enrolled") == 0
    assert _value(last, "ursa_devices_enrolled") == n
    assert _value(last, "ursa_devices_online") == n
    rounds_seen = [_value(s, "ursa_round") for s in seen]
    assert rounds_seen == sorted(rounds_seen) and rounds_seen[-1] == rounds
    assert _value(last, "ursa_round_duration_seconds_count") == rounds
    sent = _value(last, "ursa_messages_total", kind="selection_result", direction="out")
    assert sent >= rounds
    assert _value(last, "ursa_messages_total", kind="volunteer", direction="in") > 0
    assert _value(last, "ursa_bytes_total", direction="in") > _value(
        first, "ursa_bytes_total", direction="in"
    )
    assert _value(last, "ursa_crypto_seconds_total") > 0

    # the log at the default level: JSON lines, a line per stage change and
    # one per round; the token never in it
    text = log_path.read_text()
    assert "t0ken-from-env" not in text
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert {"time", "level", "logger", "message"} <= set(records[0])
    messages = [r["message"] for r in records if r["level"] == "INFO"]
    assert any(m.startswith("stage enrolment -> key_epoch") for m in messages)
    assert any(m.startswith("stage selecting -> training") for m in messages)
    for index in range(1, rounds + 1):
        (line,) = [m for m in messages if m.startswith(f"round {index} complete:")]
        assert "3 selected" in line and " in, " in line and line.endswith(" s")
    assert not [r for r in records if r["level"] == "DEBUG"]


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError as exc:
        exc.close()
        return True
    except OSError:
        return False
    return True
