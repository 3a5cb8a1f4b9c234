"""A second federation on the same store: ``serve`` refuses a finished run, ``new-run``.

The coordinator (``ursa coordinator serve``, a subprocess) runs one round with
three devices and exits. Served again on its finished store it says so and
exits non-zero, without serving; ``ursa coordinator new-run`` archives the run
and keeps the identity and the enrolled devices; served once more, the new
run completes with the same devices, which followed it without a restart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ursa.coordinator.run_archive import RUNS_DIRNAME
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.edge_sdk.state_dir import DeviceStateDir

from .conftest import polling, serve_coordinator

pytestmark = pytest.mark.integration

N = 3


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ursa.tools.cli.service", *args]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _run_of(state_dir: Path) -> str:
    store = CoordinatorStore(state_dir / DB_FILENAME)
    try:
        return store.run_id()
    finally:
        store.close()


def test_a_finished_store_is_refused_and_a_new_run_keeps_the_fleet(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("itnewrun")
    base = fed.coordinator_config(N, k=2)
    state_dir = base.state_dir
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(
        f'federation = "itnewrun"\nstate_dir = "{state_dir}"\n'
        f"min_devices = {N}\nk = 2\ntries = 2\nrounds = 1\n"
        f"key_bits = {base.key_bits}\ninsecure_test_keys = true\n"
        f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
        '[enrolment]\nmode = "tofu"\n'
        "[deadlines]\nvolunteer_s = 2\ndistributions_s = 5\nagent_s = 5\n"
    )
    env = dict(os.environ, URSA_BROKER__PASSWORD=fed.broker.credentials["coordinator"])
    log_path = tmp_path / "coordinator.log"
    clients = fed.start_devices(N)
    with polling(clients):
        process = serve_coordinator(config_file, env, log_path)
        assert process.wait(timeout=180) == 0
        first_run = _run_of(state_dir)
        identity = (state_dir / "coordinator.pub").read_text()

        again = _cli("coordinator", "serve", "--config", str(config_file), env=env)
        assert again.returncode == 3
        assert "federation finished at round 1" in again.stderr
        assert "ursa coordinator new-run" in again.stderr
        assert "broker outage" not in again.stderr

        made = _cli("coordinator", "new-run", "--config", str(config_file), env=env)
        assert made.returncode == 0, made.stderr
        assert f"{N} enrolled devices kept" in made.stdout
        second_run = _run_of(state_dir)
        assert second_run != first_run
        assert (state_dir / RUNS_DIRNAME / first_run / DB_FILENAME).exists()

        log_path.write_bytes(b"")
        process = serve_coordinator(config_file, env, log_path)
        assert process.wait(timeout=180) == 0

    assert (state_dir / "coordinator.pub").read_text() == identity
    store = CoordinatorStore(state_dir / DB_FILENAME)
    try:
        assert store.completed_rounds() == 1
        assert sorted(store.enrolled()) == fed.device_ids(N)
    finally:
        store.close()
    log = log_path.read_text()
    assert "enrolled dev" not in log  # carried over, not enrolled afresh
    for device in fed.device_ids(N):
        joined = DeviceStateDir(tmp_path / device).load_run()
        assert joined.run == second_run
        assert joined.left == (first_run,)
    refusals = [
        e for _, e in fed.capture.messages("error") if e.sender != "coordinator"
    ]
    assert not refusals


def _wait_for_lines(path: Path, line: str, count: int, processes: list[Any]) -> None:
    """Until ``line`` is in ``path`` ``count`` times; every process still running."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = path.read_text()
        if text.count(line) >= count:
            return
        assert all(p.poll() is None for p in processes), text[-3000:]
        time.sleep(0.2)
    pytest.fail(f"no {count}x {line!r}:\n" + path.read_text()[-3000:])


def test_device_processes_kept_running_take_part_in_the_next_run_and_finish_it(
    mqtt_federation: Any, tmp_path: Path
) -> None:
    fed = mqtt_federation("itfollow")
    state_dir = tmp_path / "coordinator"
    config_file = tmp_path / "coordinator.toml"

    def coordinator_toml(rounds: int) -> str:
        return (
            f'federation = "itfollow"\nstate_dir = "{state_dir}"\n'
            f"min_devices = {N}\nk = 2\ntries = 2\nrounds = {rounds}\n"
            "key_bits = 512\ninsecure_test_keys = true\n"
            f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
            '[enrolment]\nmode = "tofu"\n'
            "[deadlines]\nvolunteer_s = 2\ndistributions_s = 5\nagent_s = 5\n"
        )

    config_file.write_text(coordinator_toml(1))
    passwords = fed.broker.credentials
    env = dict(os.environ, URSA_BROKER__PASSWORD=passwords["coordinator"])
    log_path, devices_log = tmp_path / "coordinator.log", tmp_path / "devices.log"
    devices: list[subprocess.Popen[bytes]] = []
    with devices_log.open("ab") as log:
        for i, device in enumerate(fed.device_ids(N)):
            labels = tmp_path / f"{device}.txt"
            labels.write_text(" ".join(str((i + j) % 10) for j in range(30)))
            config = tmp_path / f"{device}.toml"
            config.write_text(
                f'device_id = "{device}"\nfederation = "itfollow"\n'
                f'state_dir = "{tmp_path / device}"\nobfuscator_pool_size = 2\n'
                f'insecure_test_keys = true\nlabels_file = "{labels}"\n'
                f'[broker]\nurl = "{fed.url}"\nusername = "{device}"\n'
                "keepalive_s = 5\n"
            )
            command = ["device", "run", "--keep-running", "--config", str(config)]
            devices.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ursa.tools.cli.service", *command],
                    env=dict(os.environ, URSA_BROKER__PASSWORD=passwords[device]),
                    stdout=log,
                    stderr=log,
                )
            )
    try:
        process = serve_coordinator(config_file, env, log_path)
        assert process.wait(timeout=180) == 0, log_path.read_text()[-3000:]
        first_run = _run_of(state_dir)
        _wait_for_lines(
            devices_log, "the federation is over after 1 rounds", N, devices
        )

        config_file.write_text(coordinator_toml(2))  # the next run: more rounds
        made = _cli("coordinator", "new-run", "--config", str(config_file), env=env)
        assert made.returncode == 0, made.stderr
        second_run = _run_of(state_dir)
        process = serve_coordinator(config_file, env, log_path)
        assert process.wait(timeout=180) == 0, log_path.read_text()[-3000:]
        # the same processes, never restarted, joined the new run and finished it
        _wait_for_lines(
            devices_log, "the federation is over after 2 rounds", N, devices
        )
        text = devices_log.read_text()
        assert text.count("the coordinator started a new run") == N
        assert "Traceback" not in text, text[-3000:]
        for device in devices:  # still running: SIGTERM stops them cleanly
            device.terminate()
            assert device.wait(timeout=30) == 0, devices_log.read_text()[-3000:]
    finally:
        for device in devices:
            if device.poll() is None:
                device.kill()
                device.wait()
    store = CoordinatorStore(state_dir / DB_FILENAME)
    try:
        assert store.completed_rounds() == 2
    finally:
        store.close()
    for device_id in fed.device_ids(N):
        joined = DeviceStateDir(tmp_path / device_id).load_run()
        assert (joined.run, joined.left) == (second_run, (first_run,))
