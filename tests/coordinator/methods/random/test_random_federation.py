"""A random-selection federation in memory: the runtime signs what the method draws."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ursa.coordinator.config import CoordinatorConfig
from ursa.coordinator.methods_config import FedAvgSpec, RandomSpec
from ursa.coordinator.plugin import RoundPlugin, Send
from ursa.coordinator.round_state import Stage
from ursa.coordinator.service import CoordinatorService
from ursa.crypto.identity import verify_signature
from ursa.edge_sdk.methods_config import RandomDeviceSpec as DeviceRandomSpec
from ursa.protocol.envelope import signing_bytes
from ursa.protocol.inmemory import InMemoryTransport
from ursa.protocol.messages import BaseMessage


def random_federation(federation: Any, **overrides: Any) -> Any:
    """Devices and coordinator on random selection (H = 1: the agent's loss
    does not force a new key epoch, so a returning device stays eligible)."""
    fed = federation(methods=(RandomSpec(),), tries=1, **overrides)
    fed.device_methods = (DeviceRandomSpec(),)
    return fed


def test_every_round_signs_exactly_k_online_registered_devices(federation: Any) -> None:
    fed = random_federation(federation, num_devices=8, k=3, rounds=4)
    fed.start()

    assert fed.coordinator.is_done
    notice = fed.messages("key_epoch_start")[0][1]
    assert notice.methods == ("random",)
    results = [m for _, m in fed.messages("selection_result")]
    assert [r.round for r in results] == [1, 2, 3, 4]
    for result in results:
        verify_signature(
            fed.coordinator.identity, signing_bytes(result), result.signature
        )
        assert len(set(result.selected)) == 3
        assert set(result.selected) <= set(fed.device_ids)
        assert result.try_index is None
    assert fed.messages("volunteer") == []  # devices do no selection work
    assert fed.messages("encrypted_distribution") == []
    assert {d.methods() for d in fed.devices.values()} == {("random",)}
    assert sum(len(d.stats.selected_rounds) for d in fed.devices.values()) == 12


def test_a_random_federations_store_has_no_selection_rows(federation: Any) -> None:
    fed = random_federation(federation, num_devices=4, k=2, rounds=1)
    fed.start()
    assert fed.coordinator.is_done
    store = fed.coordinator.store
    tables = store._exec("SELECT name FROM sqlite_master WHERE type = 'table'")
    names = {str(r[0]) for r in tables}
    assert not {"volunteers", "distributions", "rank_entries"} & names
    assert store._exec("SELECT COUNT(*) FROM method_rows").fetchone()[0] == 0
    assert set(store.registry_blobs(1)) == set(fed.device_ids)  # the key epoch's


def test_the_draw_differs_between_rounds(federation: Any) -> None:
    fed = random_federation(federation, num_devices=10, k=3, rounds=6)
    fed.start()
    selections = {m.selected for _, m in fed.messages("selection_result")}
    assert len(selections) > 1


class NeverDone(RoundPlugin):
    """Training that only its deadline ends (keeps a round open for the test)."""

    def on_selected(
        self, round_index: int, selected: tuple[str, ...], send: Send
    ) -> None:
        """Nothing to start."""

    def on_message(self, round_index: int, message: BaseMessage, send: Send) -> None:
        """Nothing expected."""

    def is_complete(self, round_index: int) -> bool:
        return False


def with_slow_rounds(fed: Any) -> None:
    fed.coordinator = CoordinatorService(
        fed.config,
        transport=InMemoryTransport(fed.bus, "coordinator"),
        clock=fed.clock,
        plugin=lambda _ctx: NeverDone(),
    )


def test_fewer_than_k_online_waits_asks_again_and_selects_once_one_returns(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = random_federation(federation, num_devices=4, k=3, rounds=2)
    with_slow_rounds(fed)
    fed.start()
    assert fed.coordinator.state.stage is Stage.TRAINING
    fed.devices["d02"].stop()
    fed.tick(3)  # apart, not half the fleet at once (that is held as an outage)
    fed.devices["d03"].stop()
    caplog.set_level(logging.WARNING)

    fed.tick(8)  # round 1's training deadline: round 2 opens with 2 < K online
    assert fed.coordinator.state.stage is Stage.SELECTING
    assert fed.coordinator.state.round == 2
    fed.tick(11)
    assert "random cannot select 3 of 2 eligible devices yet" in caplog.text
    assert fed.coordinator.state.stage is Stage.SELECTING
    assert len(fed.messages("selection_result")) == 1

    fed.new_device("d03").start()  # back, with the epoch's key in its state dir
    result = fed.messages("selection_result")[-1][1]
    assert result.round == 2
    assert set(result.selected) == {"d00", "d01", "d03"}


def test_a_restart_in_selecting_resumes_and_selects(federation: Any) -> None:
    fed = random_federation(federation, num_devices=4, k=3, rounds=2)
    with_slow_rounds(fed)
    fed.start()
    fed.devices["d03"].stop()
    fed.tick(3)  # apart, not half the fleet at once (that is held as an outage)
    fed.devices["d02"].stop()
    fed.tick(8)
    assert fed.coordinator.state.stage is Stage.SELECTING
    fed.coordinator.stop()

    with_slow_rounds(fed)
    fed.coordinator.start()
    assert fed.coordinator.state.stage is Stage.SELECTING
    fed.new_device("d02").start()
    results = [m for _, m in fed.messages("selection_result")]
    assert [r.round for r in results][-1] == 2
    assert set(results[-1].selected) == {"d00", "d01", "d02"}
    assert [r.round for r in results].count(2) == 1


def test_a_dubhe_device_refuses_a_random_federation(federation: Any) -> None:
    fed = federation(methods=(RandomSpec(),), num_devices=3, k=2, rounds=1)
    fed.start()  # devices keep their default: Dubhe
    refusals = [m for _, m in fed.messages("error") if m.code == "method_mismatch"]
    assert {m.sender for m in refusals} == set(fed.device_ids)
    assert refusals[0].reason == (
        "federation runs random; device is configured for dubhe"
    )
    assert fed.messages("selection_result") == []


def test_a_random_training_federation_signs_both_methods(tmp_path: Path) -> None:
    config = CoordinatorConfig(
        federation="fed",
        state_dir=tmp_path,
        methods=(RandomSpec(), FedAvgSpec()),
    )
    assert config.method_names() == ("random", "fedavg")
    assert config.selection_method() == RandomSpec()
