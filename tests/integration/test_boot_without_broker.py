"""`coordinator serve` and `device run` started before their broker wait for it.

On a Pi after a power cut the broker may come up after the device app: the
processes retry with backoff, a log line per attempt, and join once the
broker is up (issue 14). Selection only, so the test needs no torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ursa.tools.broker.mosquitto import MosquittoBroker

pytestmark = pytest.mark.integration

FED = "boot"
DEVICES = ("b0", "b1", "b2")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ursa.tools.cli.service", *args]


def _broker_section(url: str, user: str) -> str:
    return (
        f'[broker]\nurl = "{url}"\nusername = "{user}"\nkeepalive_s = 5\n'
        "reconnect_min_delay_s = 1\nreconnect_max_delay_s = 2\n"
    )


def test_serve_and_device_run_wait_for_a_broker_that_starts_later(
    mosquitto_binary: Path, tmp_path: Path
) -> None:
    broker = MosquittoBroker(
        devices=DEVICES, binary=mosquitto_binary, work_dir=tmp_path / "broker"
    )  # files written, port chosen, not running
    url = f"mqtt://127.0.0.1:{broker.port}"
    coordinator_toml = tmp_path / "coordinator.toml"
    coordinator_toml.write_text(
        f'federation = "{FED}"\nstate_dir = "{tmp_path / "coordinator"}"\n'
        f"min_devices = {len(DEVICES)}\nk = 2\nrounds = 1\nkey_bits = 512\nseed = 1\n"
        "insecure_test_keys = true\n"
        + _broker_section(url, "coordinator")
        + '[enrolment]\nmode = "tofu"\n[deadlines]\nvolunteer_s = 5\n'
        + '[[methods]]\nkind = "dubhe"\n'
    )
    log_path = tmp_path / "processes.log"
    processes: list[subprocess.Popen[bytes]] = []
    with log_path.open("ab") as log:
        serve = subprocess.Popen(
            _cli("coordinator", "serve", "--config", str(coordinator_toml)),
            env=dict(
                os.environ, URSA_BROKER__PASSWORD=broker.credentials["coordinator"]
            ),
            stdout=log,
            stderr=log,
        )
        processes.append(serve)
        for i, device in enumerate(DEVICES):
            labels = tmp_path / f"{device}.txt"
            labels.write_text(" ".join(str((i + j) % 10) for j in range(30)))
            config = tmp_path / f"{device}.toml"
            config.write_text(
                f'device_id = "{device}"\nfederation = "{FED}"\n'
                f'state_dir = "{tmp_path / device}"\nobfuscator_pool_size = 2\n'
                "insecure_test_keys = true\n"
                f'labels_file = "{labels}"\n'
                + _broker_section(url, device)
                + '[[methods]]\nkind = "dubhe"\n'
            )
            processes.append(
                subprocess.Popen(
                    _cli("device", "run", "--config", str(config)),
                    env=dict(
                        os.environ, URSA_BROKER__PASSWORD=broker.credentials[device]
                    ),
                    stdout=log,
                    stderr=log,
                )
            )
    try:
        for _ in range(300):  # every process has tried and is waiting
            text = log_path.read_text()
            if text.count("broker not reachable") >= 2 * len(processes):
                break
            assert all(p.poll() is None for p in processes), text[-3000:]
            time.sleep(0.1)
        else:
            pytest.fail(log_path.read_text()[-3000:])
        with broker:
            assert serve.wait(timeout=120) == 0, log_path.read_text()[-3000:]
        text = log_path.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert "all 1 rounds complete" in text
        for device in DEVICES:
            assert f"device {device}: connected after" in text
        assert f"coordinator: federation {FED}, run " in text  # start-up
        assert ", methods dubhe, broker mqtt://127.0.0.1:" in text
        running = 0  # a device may leave on its own at the federation's end
        for process in processes[1:]:  # the devices stop cleanly on SIGTERM
            running += process.poll() is None
            process.terminate()
            assert process.wait(timeout=30) == 0, log_path.read_text()[-3000:]
        text = log_path.read_text()
        stopping = text.count("device: stopping (SIGTERM)")
        assert stopping <= running and text.count(": stopped") >= stopping, text
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
