"""A federation split over two Mosquittos: a core broker and a bridged site broker.

The coordinator and half of the devices use the core broker; the other half
use a site broker whose generated bridge carries their traffic to the core.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.paho_client import PahoClient
from ursa.coordinator.methods_config import DubheSpec, FedAvgSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.training import TrainingConfig, TrainingPlugin
from ursa.edge_sdk.torch_trainer import TorchTrainer
from ursa.edge_sdk.training import TrainConfig
from ursa.models.registry import initial_arrays
from ursa.models.weights import arrays_to_bytes
from ursa.protocol.topics import parse_topic, status_topic
from ursa.tools.broker.bridge import SiteBridge, state_topic
from ursa.tools.broker.mosquitto import MosquittoBroker, free_port
from ursa.tools.cli.broker import register
from ursa.tools.data.loaders import load_digits

from .conftest import MqttFederation, device_labels, polling

pytestmark = pytest.mark.integration

SITE = "site-a"
CORE_DEVICES = ("dev000", "dev001", "dev002")
SITE_DEVICES = ("dev003", "dev004", "dev005")
# K = 4 of 6: every round selects at least one device of each broker.
N, K, ROUNDS = 6, 4, 3
MODEL = {"input_dim": 64, "num_classes": 10, "hidden_sizes": [16]}


class Bridged:
    """A core and a site broker, bridged, with an observer on each."""

    def __init__(self, core: MosquittoBroker, site: MosquittoBroker) -> None:
        self.core = core
        self.site = site


@pytest.fixture
def bridged(
    mosquitto_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bridged]:
    """Start the core broker (with the site's bridge user), then the site broker."""
    core = MosquittoBroker(
        devices=CORE_DEVICES,
        readers=["observer"],
        bridge_users={SITE: SITE_DEVICES},
        binary=mosquitto_binary,
        work_dir=tmp_path_factory.mktemp("core"),
    )
    bridge = SiteBridge(
        name=SITE,
        host=core.host,
        port=core.port,
        password=core.credentials[SITE],
        devices=SITE_DEVICES,
        keepalive_s=5,
    )
    site = MosquittoBroker(
        devices=SITE_DEVICES,
        readers=["observer"],
        coordinator_user=None,
        bridge=bridge,
        binary=mosquitto_binary,
        work_dir=tmp_path_factory.mktemp("site"),
    )
    with core, site:
        yield Bridged(core, site)


def _split(
    bridged: Bridged, tmp_path: Path, federation: str, connect_mqtt: Any
) -> tuple[MqttFederation, MqttFederation]:
    """The federation on the core and on the site, once the bridge is up.

    Up: the bridge's retained connection state on the core says so.
    """
    core = MqttFederation(bridged.core, tmp_path, federation, connect_mqtt)
    site = MqttFederation(bridged.site, tmp_path, federation, connect_mqtt)
    core.capture.wait_for(
        lambda: (state_topic(SITE), b"1") in core.capture.items, 20, "the bridge"
    )
    return core, site


def test_a_federation_trains_with_half_its_devices_behind_a_site_bridge(
    bridged: Bridged, connect_mqtt: Any, tmp_path: Path
) -> None:
    core, site = _split(bridged, tmp_path, "split", connect_mqtt)
    data = load_digits()
    x, y = data.flat(), data.y
    order = np.random.default_rng(0).permutation(len(y))
    parts = np.array_split(order[:600], N)
    initial = tmp_path / "initial.ursw"
    initial.write_bytes(arrays_to_bytes(initial_arrays("mlp", MODEL, seed=0)))

    config = core.coordinator_config(
        N, k=K, tries=3, rounds=ROUNDS, methods=(DubheSpec(), FedAvgSpec())
    )
    config = config.model_copy(
        update={"deadlines": config.deadlines.model_copy(update={"training_s": 60})}
    )
    build = partial(
        TrainingPlugin,
        federation="split",
        state_dir=config.state_dir,
        config=TrainingConfig(update_timeout_s=30),
        initial_weights=initial,
    )
    service = CoordinatorService(config, plugin=build)
    plugin = service.plugin
    assert isinstance(plugin, TrainingPlugin)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    clients = []
    for i, device_id in enumerate(CORE_DEVICES + SITE_DEVICES):
        fed = core if device_id in CORE_DEVICES else site
        trainer = TorchTrainer(
            x[parts[i]],
            y[parts[i]],
            model_config=MODEL,
            train=TrainConfig(epochs=1, batch_size=16, lr=0.1),
            seed=i,
        )
        clients.append(
            fed.start_device(device_id, y[parts[i]], seed=i, trainer=trainer)
        )
    try:
        with polling(clients):
            deadline = time.monotonic() + 90
            while not service.is_done and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        service.stop()
        loop.join(5)
        core.stop()
        site.stop()

    assert service.is_done, f"rounds done: {[r.round for r in plugin.history]}"
    assert plugin.version == ROUNDS
    assert all(len(r.contributed) == K for r in plugin.history)
    for record in plugin.history:  # every round had devices on both brokers
        assert set(record.contributed) & set(SITE_DEVICES), record
        assert set(record.contributed) & set(CORE_DEVICES), record
    (_, registry_sum), *_ = core.capture.messages("registry_sum")
    assert registry_sum.num_parties == N  # the site's devices enrolled via the bridge
    assert all(c.has_registry for c in clients)
    # The site saw the coordinator's global notices (retained ones included) ...
    assert site.capture.messages("registry_sum")
    # ... but no other device's down topics: the core sends a site its own only.
    down = {t.split("/")[4] for t, _ in site.capture.items if "/down/" in t}
    assert down and down <= set(SITE_DEVICES)
    # The site's devices' updates crossed the bridge, each on its own topic.
    updates = core.capture.messages("masked_update")
    crossed = [(t, m.sender) for t, m in updates if m.sender in SITE_DEVICES]
    assert crossed
    for topic, sender in crossed:
        assert (parse_topic(topic).device, parse_topic(topic).direction) == (
            sender,
            "up",
        )


def test_a_site_devices_last_will_reaches_the_coordinator(
    bridged: Bridged, connect_mqtt: Any, tmp_path: Path
) -> None:
    core, site = _split(bridged, tmp_path, "wills", connect_mqtt)
    config = core.coordinator_config(N, k=2, tries=2, rounds=100)
    service = CoordinatorService(config)
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()
    clients = []
    for i, device_id in enumerate(CORE_DEVICES + SITE_DEVICES):
        fed = core if device_id in CORE_DEVICES else site
        clients.append(fed.start_device(device_id, device_labels(i), seed=i))
    try:
        with polling(clients):
            core.capture.wait_for(
                lambda: service.online_devices() >= set(CORE_DEVICES + SITE_DEVICES),
                30,
                "every device online at the coordinator",
            )
            victim = site.clients[SITE_DEVICES[0]]
            victim.transport.kill()  # abrupt: the site broker publishes the will
            core.capture.wait_for(
                lambda: SITE_DEVICES[0] not in service.online_devices(),
                30,
                "the coordinator to see the site device leave",
            )
    finally:
        service.stop()
        loop.join(5)
        core.stop()
        site.stop()
    assert set(service.online_devices()) >= set(CORE_DEVICES + SITE_DEVICES[1:])
    wills = [
        (t, m)
        for t, m in core.capture.messages("status")
        if m.sender == SITE_DEVICES[0] and not m.online
    ]
    assert wills and wills[0][0] == status_topic("wills", SITE_DEVICES[0])


def _generate(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="ursa")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["broker", "mosquitto-config", *argv])
    assert args.handler(args) == 0


def _start(binary: Path, conf: Path, port: int) -> subprocess.Popen[bytes]:
    log = (conf.parent / "mosquitto.log").open("wb")
    process = subprocess.Popen(
        [str(binary), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert process.poll() is None, (conf.parent / "mosquitto.log").read_text()
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process
        time.sleep(0.02)
    raise AssertionError(f"mosquitto not listening on {port}")


def _credentials(path: Path) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in path.read_text().splitlines())
    return {user: password for user, password in pairs}


def test_generated_configs_bridge_a_site_to_a_tls_core(
    mosquitto_binary: Path, tmp_path: Path
) -> None:
    """The CLI's configs: TLS to the core, retained notices, ACLs at both ends."""
    local = ["--no-persistence", "--user", getpass.getuser(), "--federation", "f"]
    (tmp_path / "site-a.txt").write_text("d3\n")
    core_dir, site_dir = tmp_path / "core", tmp_path / "site"
    core_port, site_port = free_port(), free_port()
    site_list = tmp_path / "site-a.txt"
    core_argv = ["--out", str(core_dir), "--devices", "d1", "--tls", *local]
    core_argv += ["--port", str(core_port), "--bridge-user", f"{SITE}={site_list}"]
    _generate(core_argv)
    site_argv = ["--out", str(site_dir), "--devices-file", str(site_list), *local]
    site_argv += ["--port", str(site_port), "--bridge-to", f"127.0.0.1:{core_port}"]
    site_argv += ["--bridge-credentials", str(core_dir / "credentials.txt")]
    site_argv += [
        "--bridge-name",
        SITE,
        "--bridge-cafile",
        str(core_dir / "tls/ca.crt"),
    ]
    _generate(site_argv)
    core_users = _credentials(core_dir / "credentials.txt")
    site_users = _credentials(site_dir / "credentials.txt")
    ca = core_dir / "tls" / "ca.crt"
    processes = [
        _start(mosquitto_binary, core_dir / "mosquitto.conf", core_port),
        _start(mosquitto_binary, site_dir / "mosquitto.conf", site_port),
    ]
    clients: list[PahoClient] = []
    try:
        coordinator = PahoClient(
            core_port, "coordinator", core_users["coordinator"], ca
        )
        clients.append(coordinator)
        coordinator.subscribe("ursa/bridge/+/state")
        coordinator.wait_for(state_topic(SITE), b"1")
        coordinator.subscribe("ursa/v1/f/dev/+/up/#")
        # A retained notice published before the site device subscribes ...
        notice = "ursa/v1/f/global/epoch"
        coordinator.publish(notice, b"epoch-1", retain=True)
        device = PahoClient(site_port, "d3", site_users["d3"], None)
        clients.append(device)
        device.subscribe("ursa/v1/f/dev/d3/down/#")
        device.subscribe("ursa/v1/f/global/#")
        # ... is retained on the site too, so a late subscriber catches up.
        assert device.wait_for(notice, b"epoch-1") is True
        device.publish("ursa/v1/f/dev/d3/up/control", b"hello")
        coordinator.wait_for("ursa/v1/f/dev/d3/up/control", b"hello")
        coordinator.publish("ursa/v1/f/dev/d3/down/control", b"for-d3")
        device.wait_for("ursa/v1/f/dev/d3/down/control", b"for-d3")

        # The bridge user may carry only its site's devices into the core.
        forger = PahoClient(core_port, SITE, core_users[SITE], ca)
        clients.append(forger)
        forger.publish("ursa/v1/f/dev/d1/up/control", b"forged")
        forger.publish("ursa/v1/f/dev/d3/up/control", b"carried")
        coordinator.wait_for("ursa/v1/f/dev/d3/up/control", b"carried")
        assert ("ursa/v1/f/dev/d1/up/control", b"forged", False) not in [
            (t, p, False) for t, p, _ in coordinator.received
        ]
    finally:
        for client in clients:
            client.close()
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
    for folder in (core_dir, site_dir):  # the generated ACLs start quietly
        log = (folder / "mosquitto.log").read_text()
        assert "ACL pattern" not in log, log


def test_the_coordinator_sees_a_site_link_go_down_and_come_back(
    bridged: Bridged, connect_mqtt: Any, tmp_path: Path
) -> None:
    core, _ = _split(bridged, tmp_path, "links", connect_mqtt)
    service = CoordinatorService(core.coordinator_config(N, k=2, tries=2, rounds=1))
    service.start()
    loop = threading.Thread(target=service.run, daemon=True)
    loop.start()

    def link_up() -> bool | None:
        link = service.site_links.get(SITE)
        return None if link is None else link.up

    try:
        core.capture.wait_for(lambda: link_up() is True, 20, "the link seen up")
        bridged.site.stop()  # the site broker and its bridge go away
        core.capture.wait_for(lambda: link_up() is False, 20, "the link seen down")
        bridged.site.start()
        core.capture.wait_for(lambda: link_up() is True, 30, "the link seen back")
    finally:
        service.stop()
        loop.join(5)
        core.stop()
    states = [p for t, p in core.capture.items if t == state_topic(SITE)]
    assert states[-3:] == [b"1", b"0", b"1"], states
