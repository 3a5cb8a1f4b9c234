"""Dubhe's stratified draw in memory: ranks handed out, private selections."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.methods.dubhe import DubheSelection
from ursa.coordinator.methods.dubhe import ranks as coordinator_ranks
from ursa.coordinator.methods.dubhe.records import RANK_KEYS, DubheRecords
from ursa.coordinator.methods_config import DubheSpec
from ursa.coordinator.store import DB_FILENAME
from ursa.crypto.identity import verify_signature
from ursa.edge_sdk.methods.dubhe import method as device_dubhe
from ursa.edge_sdk.methods.dubhe.draws import stratified_volunteers
from ursa.edge_sdk.methods.dubhe.method import Dubhe
from ursa.edge_sdk.methods.dubhe.ranks import new_one_time_key, shared_seed
from ursa.edge_sdk.methods_config import DubheDeviceSpec as DeviceDubheSpec
from ursa.protocol.envelope import decode, signing_bytes
from ursa.protocol.errors import ProtocolError
from ursa.protocol.messages import ErrorCode, Registration

from .test_migration import write_as_before


def stratified(federation: Any, **overrides: Any) -> Any:
    # the pure draw knows no participation cap
    spec = DubheSpec(draw="stratified", max_participation=1.0)
    fed = federation(methods=(spec,), **overrides)
    fed.device_methods = (DeviceDubheSpec(draw="stratified"),)
    return fed


def expected_sets(fed: Any, rounds: int, k: int, tries: int) -> list[set[str]]:
    """What `stratified_volunteers` selects per (round, try) from the devices' state.

    Registry, slots, ranks and the shared seed are read from the devices
    (the coordinator has none of them), so the service's sets are compared
    with the pure draw on the same inputs.
    """
    ids = sorted(fed.devices)
    clients = [fed.devices[d] for d in ids]
    registry = clients[0].epoch_view.registry
    assert registry is not None
    epoch = 1
    indices = np.array([c.epoch_view.index for c in clients])
    ranks = np.array([c.method(Dubhe).rank(epoch) for c in clients])
    secret = clients[0].epoch_view.secret_key
    assert secret is not None
    seed = shared_seed(secret.secret_to_bytes(), fed.config.federation, epoch)
    out = []
    for r in range(1, rounds + 1):
        for h in range(tries):
            chosen = stratified_volunteers(registry, indices, ranks, k, seed, r, h)
            out.append({ids[i] for i in np.flatnonzero(chosen)})
    return out


def selections(fed: Any) -> dict[int, set[str]]:
    """Round -> selected devices, as each device's private result says."""
    out: dict[int, set[str]] = {}
    for topic, result in fed.messages("selection_result"):
        verify_signature(
            fed.coordinator.identity, signing_bytes(result), result.signature
        )
        (device,) = result.selected  # each result names its device alone ...
        assert f"/dev/{device}/down/" in topic  # ... and goes to it alone
        out.setdefault(result.round, set()).add(device)
    return out


def test_the_service_selects_exactly_what_the_pure_stratified_draw_selects(
    federation: Any,
) -> None:
    fed = stratified(federation, num_devices=12, k=3, tries=1, rounds=4)
    fed.start()

    assert fed.coordinator.is_done
    ranks = [c.method(Dubhe).rank(1) for c in fed.devices.values()]
    assert None not in ranks
    registry = next(iter(fed.devices.values())).epoch_view.registry
    assert registry is not None
    indices = Counter(c.epoch_view.index for c in fed.devices.values())
    for slot, count in indices.items():  # ranks are 0..R(u)-1 within each slot
        got = sorted(
            c.method(Dubhe).rank(1)
            for c in fed.devices.values()
            if c.epoch_view.index == slot
        )
        assert got == list(range(count)) and registry[slot] == count
    expected = expected_sets(fed, 4, 3, 1)
    served = selections(fed)
    assert [served[r] for r in range(1, 5)] == expected
    assert all(len(s) == 3 for s in expected)
    # 12 devices, under the explicit-replies threshold: every device answers
    # each round, and exactly the K of the quotas draw yes
    answers = [m for _, m in fed.messages("volunteer")]
    assert Counter(m.round for m in answers) == {r: 12 for r in range(1, 5)}
    yes = Counter(m.round for m in answers if any(m.draws))
    assert yes == {r: 3 for r in range(1, 5)}
    # nothing was broadcast: no global topic carried a selection
    assert all("/dev/" in t for t, _ in fed.messages("selection_result"))


def test_the_coordinator_sees_no_seed_nor_one_time_key_nor_device_ids_in_pages(
    federation: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[bytes] = []

    def recorded() -> bytes:
        key = new_one_time_key()
        made.append(key)
        return key

    monkeypatch.setattr(device_dubhe, "new_one_time_key", recorded)
    fed = stratified(federation, num_devices=8, k=2, tries=2, rounds=2)
    fed.start()
    assert fed.coordinator.is_done
    assert fed.messages("rank_request") and fed.messages("sealed_rank")
    assert len(made) == 8  # one one-time key per device and epoch

    secret = next(iter(fed.devices.values())).epoch_view.secret_key
    seed = shared_seed(secret.secret_to_bytes(), fed.config.federation, 1)
    needles = [str(seed).encode(), seed.to_bytes(8, "big"), f"{seed:x}".encode()]
    needles += [k for key in made for k in (key, key.hex().encode())]
    needles.append(secret.secret_to_bytes())
    states = [
        json.loads((c.link.store.path / "methods.json").read_text())
        for c in fed.devices.values()
    ]
    assert all("one_time" not in s["dubhe"]["rank"] for s in states)  # gone
    traffic = b"\x00".join(p for _, p in fed.captured)
    fed.coordinator.store.flush()
    database = b"".join(
        p.read_bytes()
        for p in (tmp_path / "coordinator").iterdir()
        if p.name.startswith(DB_FILENAME)
    )
    assert database
    for needle in needles:
        assert needle not in traffic and needle not in database
    # the rank pages carry no device id: only ciphertexts and one-time keys,
    # and each sealed rank reaches its device alone
    for _, request in fed.messages("rank_request"):
        assert request.sender == "coordinator"
        assert all(
            set(e.model_dump()) == {"registry", "rank_key"} for e in request.entries
        )
    for topic, _ in fed.messages("sealed_rank"):
        assert "/dev/" in topic and "/down/" in topic
    # and the needles are real: the pure draw needs the seed the devices use
    assert expected_sets(fed, 2, 2, 2) == [
        {m.sender for _, m in fed.messages("volunteer") if m.round == r and m.draws[h]}
        for r in (1, 2)
        for h in (0, 1)
    ]


def test_a_device_with_the_paper_draw_is_refused_at_registration(
    federation: Any,
) -> None:
    fed = federation(methods=(DubheSpec(draw="stratified"),), num_devices=4, k=2)
    fed.device_methods = (DeviceDubheSpec(draw="paper"),)
    fed.start(settle=False)
    codes = {e.code for d in fed.device_ids for e in fed.errors_to(d)}
    assert ErrorCode.METHOD_MISMATCH in codes
    assert fed.messages("rank_request") == []


@pytest.mark.parametrize("old_form", [False, True], ids=["store", "old_form"])
def test_a_coordinator_killed_mid_hand_out_resends_only_the_open_pages(
    federation: Any, monkeypatch: pytest.MonkeyPatch, old_form: bool
) -> None:
    """``old_form``: the store is rewritten as the versions before wrote it
    (the rank keys in the core ``rank_entries``); the restart moves them."""
    monkeypatch.setattr(coordinator_ranks, "RANK_PAGE_SIZE", 3)
    fed = stratified(federation, num_devices=10, k=3, tries=1, rounds=3)

    def drop(s: str, r: str, topic: str, payload: bytes) -> bool:
        if r != "coordinator":
            return False
        try:
            message = decode(payload)
        except ProtocolError:
            return False
        return message.kind == "sealed_ranks" and message.page >= 1

    fed.bus.drop_filter = drop
    fed.start(settle=False)
    requests = [m for _, m in fed.messages("rank_request")]
    assert sorted(r.page for r in requests) == [0, 1, 2]  # a window of two
    assert {r.pages for r in requests} == {4}
    assert sum(c.method(Dubhe).rank(1) is not None for c in fed.devices.values()) == 3

    fed.coordinator_transport.kill()  # kill -9
    fed.coordinator.store.close()
    if old_form:
        write_as_before(fed.config.state_dir / DB_FILENAME)
    fed.bus.drop_filter = None
    before = len(fed.messages("rank_request"))
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    fed.settle()

    resent = [m for _, m in fed.messages("rank_request")[before:]]
    assert sorted(r.page for r in resent) == [1, 2, 3]  # page 0 was complete
    assert fed.coordinator.is_done
    assert all(c.method(Dubhe).rank(1) is not None for c in fed.devices.values())
    served = selections(fed)
    assert [served[r] for r in range(1, 4)] == expected_sets(fed, 3, 3, 1)


def test_a_registration_and_its_rank_key_are_kept_together_or_not_at_all(
    federation: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fed = stratified(federation, num_devices=5, k=2, tries=1, rounds=1)
    victim = sorted(fed.device_ids)[0]
    keep = DubheSelection.registered

    def failing(self: DubheSelection, epoch: int, registration: Registration) -> None:
        keep(self, epoch, registration)  # the rank key's row is written ...
        if registration.sender == victim:  # ... and then the write fails
            raise sqlite3.OperationalError("disk I/O error (injected)")

    monkeypatch.setattr(DubheSelection, "registered", failing)
    fed.bus.drop_filter = lambda s, r, topic, payload: "sealed_ranks" in topic
    fed.start(settle=False)

    store = fed.coordinator.store
    record = store.epoch(1)
    assert record is not None and victim not in record.registered
    others = set(fed.device_ids) - {victim}
    assert record.registered == others
    assert set(store.registry_blobs(1)) == others
    assert set(store.method_rows("dubhe", f"{RANK_KEYS}1")) == others
    assert set(DubheRecords(store).rank_entries(1)) == others
    assert "internal error on a message" in caplog.text
