"""A device whose data does not fit sits the key epoch out, and no round waits on it.

The clock never moves in these tests: a federation that finishes its rounds
has waited out no deadline.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from tests.refusing_device import RefusingDevice
from ursa.coordinator.methods_config import RandomSpec
from ursa.coordinator.status import read_status
from ursa.edge_sdk.client import EdgeClient, device_will
from ursa.edge_sdk.methods_config import RandomDeviceSpec as DeviceRandomSpec
from ursa.protocol.envelope import decode
from ursa.protocol.inmemory import InMemoryTransport

from .conftest import device_labels

MISFIT = "d00"
OUTSIDE = "labels 12 lie outside the federation's 10 classes 0..9"


def start_with_misfit(fed: Any, labels: np.ndarray) -> None:
    """Start the coordinator and the devices; ``MISFIT`` holds ``labels``."""
    fed.coordinator.start()
    for index, device_id in enumerate(fed.device_ids):
        config = fed.device_config(device_id)
        topic, payload = device_will(config)
        transport = InMemoryTransport(fed.bus, device_id, will=(topic, payload, True))
        client = EdgeClient(
            config,
            labels if device_id == MISFIT else device_labels(index),
            transport=transport,
            rng=np.random.default_rng(index),
        )
        fed.devices[device_id] = client
        fed.transports[device_id] = transport
        client.start()


def configure(federation: Any, selection: str) -> Any:
    if selection == "dubhe":
        return federation(num_devices=5, k=2, tries=2, rounds=3)
    fed = federation(num_devices=5, k=2, tries=1, rounds=3, methods=(RandomSpec(),))
    fed.device_methods = (DeviceRandomSpec(),)
    return fed


@pytest.mark.parametrize("selection", ["dubhe", "random"])
def test_labels_outside_the_classes_sit_out_and_rounds_do_not_wait(
    federation: Any, selection: str, caplog: pytest.LogCaptureFixture
) -> None:
    fed = configure(federation, selection)
    caplog.set_level(logging.INFO)

    started = fed.clock.now
    start_with_misfit(fed, np.r_[np.arange(10), 12, 12])
    fed.settle()  # Dubhe: silent devices, so volunteering windows run out

    refusals = [m for _, m in fed.messages("error") if m.code == "data_mismatch"]
    assert [(m.sender, m.reason) for m in refusals] == [(MISFIT, OUTSIDE)]
    assert fed.coordinator.is_done
    windows = 3 * fed.config.deadlines.volunteer_s  # nothing else waited
    assert fed.clock.now - started <= (windows if selection == "dubhe" else 0)
    assert fed.coordinator.store.completed_rounds() == 3
    selected = [set(m.selected) for _, m in fed.messages("selection_result")]
    assert len(selected) == 3
    assert all(len(s) == 2 and MISFIT not in s for s in selected)
    assert all(m.sender != MISFIT for _, m in fed.messages("registration"))
    assert all(m.sender != MISFIT for _, m in fed.messages("volunteer"))
    assert fed.devices[MISFIT].sits_out
    assert not any(fed.devices[d].sits_out for d in fed.device_ids[1:])
    device_errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == "ursa.edge_sdk"
    ]
    assert device_errors == [
        f"{MISFIT}: sitting out key epoch 1: data_mismatch: {OUTSIDE} (remedy: "
        "relabel the data to 0..9 or join a federation with num_classes >= 13)"
    ]
    assert (
        f"{MISFIT} sits out: data_mismatch: {OUTSIDE} (excluded from key epoch 1)"
        in caplog.text
    )
    status = read_status(fed.config.state_dir)
    assert status.sitting_out == {MISFIT: f"data_mismatch: {OUTSIDE}"}


def test_a_device_that_sits_out_is_eligible_again_in_the_next_epoch(
    federation: Any,
) -> None:
    fed = federation(num_devices=4, k=2, tries=1, rounds=4, rounds_per_epoch=2)
    fed.config = fed.config.model_copy(update={"methods": (RandomSpec(),)})
    fed.coordinator = fed.new_coordinator()
    fed.device_methods = (DeviceRandomSpec(),)

    start_with_misfit(fed, np.r_[np.arange(10), 12])

    assert fed.coordinator.is_done
    notices = [m.epoch for _, m in fed.messages("key_epoch_start")]
    assert notices == [1, 2]
    refusals = [m for _, m in fed.messages("error") if m.code == "data_mismatch"]
    assert len(refusals) == 2  # one answer per epoch: the labels still do not fit
    selected = [set(m.selected) for _, m in fed.messages("selection_result")]
    assert len(selected) == 4 and all(MISFIT not in s for s in selected)


def test_a_restarted_coordinator_still_leaves_the_device_out(federation: Any) -> None:
    fed = federation(num_devices=4, k=2, tries=1, rounds=1)
    start_with_misfit(fed, np.r_[np.arange(10), 12])
    assert fed.coordinator.is_done
    fed.coordinator.stop()

    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()

    online = fed.coordinator.online_devices()
    assert MISFIT not in online and set(fed.device_ids[1:]) <= online


def test_a_device_with_other_methods_is_not_waited_for_either(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = configure(federation, "random")
    caplog.set_level(logging.INFO)
    fed.coordinator.start()
    for device_id in fed.device_ids:
        if device_id == MISFIT:
            fed.device_methods = None  # Dubhe, the default
        client = fed.new_device(device_id)
        fed.device_methods = (DeviceRandomSpec(),)
        client.start()

    assert fed.coordinator.is_done  # registration did not wait for it
    refusals = [m for _, m in fed.messages("error") if m.code == "method_mismatch"]
    assert [m.sender for m in refusals] == [MISFIT]
    assert f"{MISFIT} sits out: method_mismatch: federation runs random" in caplog.text
    selected = [set(m.selected) for _, m in fed.messages("selection_result")]
    assert len(selected) == 3 and all(MISFIT not in s for s in selected)


def test_a_device_whose_refusals_used_their_re_keys_sits_out_after_a_restart(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fed = federation(num_devices=5, k=2, tries=1, rounds=1, quorum=3)
    first, second = RefusingDevice(fed, "d04"), RefusingDevice(fed, "d03")
    held = fed.device_ids[0]  # its registrations are lost: registration stays open
    fed.bus.drop_filter = lambda s, r, t, p: (
        s == held and r == "coordinator" and decode(p).kind == "registration"
    )
    fed.start(settle=False)
    first.refuse(first.acceptances()[-1])  # key epoch 2, without d04
    assert fed.coordinator.state.epoch == 2
    fed.coordinator.stop()
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    caplog.set_level(logging.WARNING, logger="ursa.coordinator")

    counted = first.hello()  # counted again from the next key epoch on
    second.refuse(second.hello())  # key epoch 3, with d04
    assert fed.coordinator.state.epoch == 3
    first.refuse(counted)

    assert fed.coordinator.state.epoch == 3  # its one re-key an hour is used up
    assert "d04 sits key epoch 3 out instead of keying again" in caplog.text
    assert "d04" not in fed.coordinator.online_devices()
    fed.bus.drop_filter = None
    fed.tick(fed.config.deadlines.registration_s)
    fed.settle()
    assert fed.coordinator.is_done


def test_a_device_without_insecure_test_keys_refuses_small_keys_and_sits_out(
    federation: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The floor is the device's own: 512-bit keys signed by its coordinator
    are refused unless its config says ``insecure_test_keys``."""
    fed = federation(num_devices=4, k=2, tries=1, rounds=1, min_devices=3)
    caplog.set_level(logging.INFO)
    fed.coordinator.start()
    for device_id in fed.device_ids:
        config = fed.device_config(device_id)
        if device_id == MISFIT:  # a device as shipped: no test switch
            config = config.model_copy(update={"insecure_test_keys": False})
        client = EdgeClient(
            config,
            device_labels(int(device_id[1:])),
            transport=InMemoryTransport(fed.bus, device_id, will=device_will(config)),
            rng=np.random.default_rng(int(device_id[1:])),
        )
        fed.devices[device_id] = client
        client.start()
    fed.settle()

    assert fed.coordinator.is_done
    refusals = [m for _, m in fed.messages("error") if m.code == "insecure_parameters"]
    assert [m.sender for m in refusals] == [MISFIT]
    assert "uses 512-bit Paillier keys; this device accepts 2048" in refusals[0].reason
    registered = {m.sender for _, m in fed.messages("registration")}
    assert registered and MISFIT not in registered
    selected = [set(m.selected) for _, m in fed.messages("selection_result")]
    assert selected and all(MISFIT not in s for s in selected)


def test_status_names_the_device_sitting_out_with_its_reason(
    federation: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ursa.tools.cli.app import main

    from .test_status import _clear_ursa_env, _config_file

    _clear_ursa_env(monkeypatch)
    fed = configure(federation, "random")
    start_with_misfit(fed, np.r_[np.arange(10), 12])
    fed.settle()

    assert main(["coordinator", "status", "--config", str(_config_file(fed))]) == 0
    text = capsys.readouterr().out
    assert f"sitting key epoch 1 out:\n  {MISFIT:<16} data_mismatch: {OUTSIDE}\n" in (
        text
    )
