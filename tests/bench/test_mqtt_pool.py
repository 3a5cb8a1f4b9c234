"""`MqttPool`: many paho clients on one loop thread, over a real Mosquitto."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import DEVICE_IDS, MosquittoFactory
from ursa.bench.mqtt_pool import MqttPool, PooledTransport
from ursa.protocol.transport import (
    BrokerRefusedError,
    NotConnectedError,
    TransportError,
    TransportTimeoutError,
)
from ursa.tools.broker.mosquitto import MosquittoBroker

pytestmark = pytest.mark.integration

CLIENTS = 40


@pytest.fixture
def pool() -> Iterator[MqttPool]:
    made = MqttPool()
    yield made
    made.close()


@pytest.fixture
def running_pool(pool: MqttPool) -> Iterator[MqttPool]:
    """The pool served on its own thread (callers block, as a coordinator does)."""
    stop = threading.Event()
    loop = threading.Thread(target=pool.run, args=(stop,))
    loop.start()
    yield pool
    stop.set()
    loop.join()


def _run_until(pool: MqttPool, done: Callable[[], bool], limit_s: float = 20.0) -> bool:
    """Turn the loop until `done()` (a generous safety limit, not a timing check)."""
    deadline = time.monotonic() + limit_s
    while not done():
        if time.monotonic() > deadline:
            return False
        pool.run_once(0.05)
    return True


def _ready(transport: PooledTransport) -> bool:
    return transport.is_connected and not transport.subscribing


def _clients(pool: MqttPool, broker: MosquittoBroker) -> list[PooledTransport]:
    return [
        pool.transport(broker.mqtt_config(d).model_copy(update={"keepalive_s": 5}))
        for d in DEVICE_IDS[:CLIENTS]
    ]


def test_many_clients_on_one_loop_each_get_their_own_messages(
    pool: MqttPool, mosquitto_factory: MosquittoFactory
) -> None:
    broker = mosquitto_factory()
    got: dict[str, list[bytes]] = {d: [] for d in DEVICE_IDS[:CLIENTS]}
    clients = _clients(pool, broker)
    for client in clients:
        own = client.client_id
        client.set_handler(lambda _t, p, own=own: got[own].append(p))
        client.subscribe(f"ursa/v1/f/dev/{own}/down/#")
        client.open()
    assert _run_until(pool, lambda: all(_ready(c) for c in clients))
    coordinator = pool.transport(broker.mqtt_config("coordinator"))
    coordinator.open()
    assert _run_until(pool, lambda: coordinator.is_connected)
    for device in got:
        coordinator.publish(f"ursa/v1/f/dev/{device}/down/x", device.encode())
    assert _run_until(pool, lambda: all(got.values()))
    assert got == {d: [d.encode()] for d in got}
    assert not [t for t in threading.enumerate() if t.name.startswith("paho")]


def test_clients_reconnect_and_resubscribe_after_a_broker_restart(
    pool: MqttPool, mosquitto_factory: MosquittoFactory
) -> None:
    broker = mosquitto_factory()
    clients = _clients(pool, broker)
    got: list[str] = []
    for client in clients:
        client.set_handler(lambda topic, _p: got.append(topic))
        client.subscribe("ursa/v1/f/global/#")
        client.open()
    assert _run_until(pool, lambda: all(c.is_connected for c in clients))
    broker.restart()
    assert _run_until(
        pool, lambda: all(c.connections == 2 and _ready(c) for c in clients), 60
    )
    sender = pool.transport(broker.mqtt_config("coordinator"))
    sender.open()
    assert _run_until(pool, lambda: sender.is_connected)
    sender.publish("ursa/v1/f/global/hello", b"x")
    assert _run_until(pool, lambda: len(got) == CLIENTS)


def test_a_publish_from_another_thread_waits_for_the_loop_and_flushes(
    running_pool: MqttPool, mosquitto_factory: MosquittoFactory
) -> None:
    pool, broker = running_pool, mosquitto_factory()
    receiver = pool.transport(broker.mqtt_config("coordinator"))
    got: list[bytes] = []
    receiver.set_handler(lambda _t, p: got.append(p))
    receiver.subscribe("ursa/v1/f/dev/+/up/#")
    receiver.connect()
    deadline = time.monotonic() + 20
    while receiver.subscribing and time.monotonic() < deadline:
        time.sleep(0.01)
    device = pool.transport(broker.mqtt_config(DEVICE_IDS[0]))
    device.connect()
    device.publish(f"ursa/v1/f/dev/{DEVICE_IDS[0]}/up/control", b"hi")
    device.flush(10.0)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == [b"hi"]
    with pytest.raises(TransportError):
        device.connect()  # not NEW any more


def test_bad_credentials_close_the_transport_for_good(
    running_pool: MqttPool, mosquitto_factory: MosquittoFactory
) -> None:
    broker = mosquitto_factory()
    config = broker.mqtt_config(DEVICE_IDS[0]).model_copy(
        update={"password": None, "username": DEVICE_IDS[0]}
    )
    with pytest.raises(BrokerRefusedError):
        running_pool.transport(config).connect()


def test_tls_is_refused_up_front(
    pool: MqttPool, mosquitto_factory: MosquittoFactory
) -> None:
    broker = mosquitto_factory(tls=True)
    with pytest.raises(ValueError, match="TLS"):
        pool.transport(broker.mqtt_config(DEVICE_IDS[0]))


def test_flush_counts_hand_offs_to_the_loop_and_ends_at_close(
    pool: MqttPool, mosquitto: MosquittoBroker
) -> None:
    transport = pool.transport(mosquitto.mqtt_config(DEVICE_IDS[0]))
    transport.open()  # connecting; the loop is not turning, so nothing is sent
    transport.publish(f"ursa/v1/f/dev/{DEVICE_IDS[0]}/up/control", b"hi")

    with pytest.raises(TransportTimeoutError, match="1 publishes unacknowledged"):
        transport.flush(0.0)  # the publish still waits for the loop
    transport.close()
    with pytest.raises(NotConnectedError, match="closed before PUBACKs"):
        transport.flush(10.0)
