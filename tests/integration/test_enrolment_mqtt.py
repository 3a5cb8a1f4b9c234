"""A refused enrolment over a real Mosquitto, and its remedy (issue 32, item 4).

The coordinator (``ursa coordinator serve``, a subprocess) runs in pinned
mode with no pins. A device's Hello is refused: both sides log the device's
fingerprint and the ``ursa coordinator enrol`` command, and the device keeps
saying Hello with backoff. The operator runs that command; the same running
device is admitted at its next Hello, without a restart on either side.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ursa.edge_sdk.client import EdgeClient

from .conftest import polling, serve_coordinator

pytestmark = pytest.mark.integration

DEVICE = "dev000"


def test_a_refused_device_is_admitted_after_enrol_without_a_restart(
    mqtt_federation: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fed = mqtt_federation("itenrol")
    state_dir = tmp_path / "coordinator"
    config_file = tmp_path / "coordinator.toml"
    config_file.write_text(
        f'federation = "itenrol"\nstate_dir = "{state_dir}"\n'
        "min_devices = 2\nk = 1\ntries = 1\nrounds = 1\n"
        "key_bits = 512\ninsecure_test_keys = true\n"
        f'[broker]\nurl = "{fed.url}"\nusername = "coordinator"\nkeepalive_s = 5\n'
        '[enrolment]\nmode = "pinned"\n'
    )
    env = dict(os.environ, URSA_BROKER__PASSWORD=fed.broker.credentials["coordinator"])
    log_path = tmp_path / "coordinator.log"
    process = serve_coordinator(config_file, env, log_path)
    caplog.set_level(logging.INFO, logger="ursa.edge_sdk")
    try:
        client = EdgeClient(
            fed.device_config(DEVICE),
            np.arange(20) % 10,
            rng=np.random.default_rng(0),
        )
        fed.clients[DEVICE] = client
        with polling([client], every_s=0.2):
            client.start()
            fed.capture.wait_for(
                lambda: any(
                    not m.accepted and m.device_id == DEVICE
                    for _, m in fed.capture.messages("enrol_result")
                ),
                60,
                "the coordinator's refusal",
            )
            fingerprint = client.link.identity.public().fingerprint()
            command = (
                "ursa coordinator enrol --config <coordinator config> "
                f"--device {DEVICE} --fingerprint {fingerprint}"
            )
            refused = [
                r.getMessage()
                for r in caplog.records
                if "enrolment refused" in r.getMessage()
            ]
            assert refused and fingerprint in refused[0] and command in refused[0]
            fed.capture.wait_for(
                lambda: "refused enrolment of" in log_path.read_text(),
                30,
                "the coordinator's refusal line",
            )
            line = next(
                x
                for x in log_path.read_text().splitlines()
                if "refused enrolment of" in x
            )
            assert DEVICE in line and fingerprint in line and command in line
            hellos = len(fed.capture.messages("hello"))
            fed.capture.wait_for(
                lambda: len(fed.capture.messages("hello")) > hellos,
                30,
                "a hello again after the refusal",
            )
            assert not client.enrolled.is_set()

            enrol = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "ursa.tools.cli.service",
                    "coordinator",
                    "enrol",
                    "--config",
                    str(config_file),
                    "--device",
                    DEVICE,
                    "--fingerprint",
                    fingerprint,
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert enrol.returncode == 0, enrol.stderr
            assert client.enrolled.wait(60), "not admitted after enrol"
        assert process.poll() is None  # the same coordinator: no restart
    finally:
        process.terminate()
        process.wait(timeout=30)
