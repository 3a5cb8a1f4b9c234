"""Dubhe's stratified draw served over a real Mosquitto: the pure draw's sets."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods_config import DubheSpec
from ursa.coordinator.service import CoordinatorService
from ursa.coordinator.store import DB_FILENAME
from ursa.crypto.identity import verify_signature
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.methods.dubhe import method as device_dubhe
from ursa.edge_sdk.methods.dubhe.draws import stratified_volunteers
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.dubhe.ranks import new_one_time_key, shared_seed
from ursa.edge_sdk.methods_config import DubheDeviceSpec as DeviceDubheSpec
from ursa.lab.simulate.selection_draws import draw_sets
from ursa.protocol.envelope import signing_bytes
from ursa.tools.data.metrics import distance_to_uniform

from .conftest import device_labels

pytestmark = pytest.mark.integration

N = 24
K = 4
H = 2
ROUNDS = 4


def _start(fed: Any) -> list[EdgeClient]:
    clients = []
    for index, device_id in enumerate(fed.device_ids(N)):
        config = fed.device_config(device_id).model_copy(
            update={"methods": (DeviceDubheSpec(draw="stratified"),)}
        )
        client = EdgeClient(
            config, device_labels(index), rng=np.random.default_rng(index)
        )
        client.start()
        fed.clients[device_id] = client
        clients.append(client)
    return clients


def test_the_served_federation_selects_exactly_the_pure_stratified_sets(
    mqtt_federation: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[bytes] = []

    def recorded() -> bytes:
        key = new_one_time_key()
        made.append(key)
        return key

    monkeypatch.setattr(device_dubhe, "new_one_time_key", recorded)
    fed = mqtt_federation("itstrat")
    config = fed.coordinator_config(
        N,
        k=K,
        tries=H,
        rounds=ROUNDS,  # the pure draw's tries: no participation cap
        methods=(DubheSpec(draw="stratified", max_participation=1.0),),
    )
    service = CoordinatorService(config)
    service.start()
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    clients = _start(fed)
    thread.join(timeout=120)
    assert service.is_done, f"stuck at {service.state}"

    # What every device holds (the coordinator holds none of it) ...
    ids = [c.device_id for c in clients]
    registry = clients[0].epoch_view.registry
    secret = clients[0].epoch_view.secret_key
    assert registry is not None and secret is not None
    indices = np.array([c.epoch_view.index for c in clients])
    ranks = np.array([c.method(Dubhe).rank(1) for c in clients])
    assert None not in ranks.tolist()
    seed = shared_seed(secret.secret_to_bytes(), "itstrat", 1)

    # ... and what reached each selected device, alone, signed.
    served: dict[int, tuple[set[str], int | None]] = {}
    for topic, result in fed.capture.messages("selection_result"):
        verify_signature(service.identity, signing_bytes(result), result.signature)
        (device,) = result.selected
        assert f"/dev/{device}/down/" in topic
        chosen, _ = served.setdefault(result.round, (set(), result.try_index))
        chosen.add(device)
    assert sorted(served) == list(range(1, ROUNDS + 1))

    # 24 devices, under the explicit-replies threshold: every device answers,
    # and the yes of each try are exactly the pure draw's
    spoke = {r: set() for r in served}
    answered = {r: set() for r in served}
    for _, volunteer in fed.capture.messages("volunteer"):
        answered[volunteer.round].add(volunteer.sender)
        if any(volunteer.draws):
            spoke[volunteer.round].add(volunteer.sender)
    assert all(answered[r] == set(ids) for r in served)
    for r, (chosen, try_index) in served.items():
        assert try_index is not None and len(chosen) == K
        tries = [
            {ids[i] for i in np.flatnonzero(mask)}
            for mask in (
                stratified_volunteers(registry, indices, ranks, K, seed, r, h)
                for h in range(H)
            )
        ]
        assert chosen == tries[try_index]  # the agent's pick among the pure tries
        assert spoke[r] == set().union(*tries)  # and nobody else said yes

    # Nothing private in the traffic or the coordinator's database: not the
    # one-time keys, the shared seed, the epoch's secret key; no selection
    # broadcast; the rank pages name no device.
    assert len(made) == N
    needles = [str(seed).encode(), seed.to_bytes(8, "big"), secret.secret_to_bytes()]
    needles += [k for key in made for k in (key, key.hex().encode())]
    with fed.capture.lock:
        traffic = b"\x00".join(p for _, p in fed.capture.items)
    service.stop()
    database = b"".join(
        p.read_bytes()
        for p in config.state_dir.iterdir()
        if p.name.startswith(DB_FILENAME)
    )
    assert traffic and database
    for needle in needles:
        assert needle not in traffic and needle not in database
    assert fed.capture.messages("rank_request") and fed.capture.messages("sealed_rank")
    for _, request in fed.capture.messages("rank_request"):
        assert all(
            set(e.model_dump()) == {"registry", "rank_key"} for e in request.entries
        )

    # balance: the served sets vs the simulator's stratified draw, same registry
    dists = np.stack(
        [np.bincount(c.data.labels, minlength=10) / c.data.labels.size for c in clients]
    )
    served_l1 = np.mean(
        [
            distance_to_uniform(dists[[ids.index(d) for d in served[r][0]]].mean(0))
            for r in served
        ]
    )
    sets, _ = draw_sets("stratified", registry, indices, K, ROUNDS, H, 0, search=False)
    simulated_l1 = np.mean(
        [
            distance_to_uniform(dists[sets[r, h]].mean(0))
            for r in range(ROUNDS)
            for h in range(H)
        ]
    )
    served_tries_l1 = np.mean(
        [
            distance_to_uniform(dists[list(np.flatnonzero(m))].mean(0))
            for r in served
            for m in (
                stratified_volunteers(registry, indices, ranks, K, seed, r, h)
                for h in range(H)
            )
        ]
    )
    print(
        f"\nmean L1 to uniform: served selections {served_l1:.3f}, served tries "
        f"{served_tries_l1:.3f}, simulator stratified tries {simulated_l1:.3f}"
    )
