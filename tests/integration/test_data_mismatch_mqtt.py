"""A device whose labels do not fit sits out over a real Mosquitto; nothing waits."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from ursa.coordinator.config import DeadlinesConfig
from ursa.coordinator.methods_config import RandomSpec
from ursa.coordinator.service import CoordinatorService
from ursa.edge_sdk.client import EdgeClient
from ursa.edge_sdk.methods_config import RandomSpec as DeviceRandomSpec

from .conftest import device_labels

pytestmark = pytest.mark.integration

NEVER_S = 3600
"""Every deadline: a run that finishes has waited out none of them."""


def test_a_misfit_device_answers_data_mismatch_and_is_never_selected(
    mqtt_federation: Any,
) -> None:
    fed = mqtt_federation("itmisfit")
    deadlines = DeadlinesConfig(
        key_epoch_s=NEVER_S,
        registration_s=NEVER_S,
        volunteer_s=NEVER_S,
        distributions_s=NEVER_S,
        agent_s=NEVER_S,
        training_s=NEVER_S,
    )
    config = fed.coordinator_config(
        4, k=2, tries=1, rounds=3, methods=(RandomSpec(),), deadlines=deadlines
    )
    service = CoordinatorService(config)
    service.start()
    thread = threading.Thread(target=service.run, name="coordinator", daemon=True)
    thread.start()
    misfit, *others = fed.device_ids(4)
    for index, device_id in enumerate(fed.device_ids(4)):
        labels = (
            np.r_[np.arange(10), 12] if device_id == misfit else device_labels(index)
        )
        device_config = fed.device_config(device_id).model_copy(
            update={"methods": (DeviceRandomSpec(),)}
        )
        client = EdgeClient(device_config, labels, rng=np.random.default_rng(index))
        fed.clients[device_id] = client
        client.start()

    thread.join(timeout=60)
    assert service.is_done, f"stuck at {service.state}"
    refusals = [m for _, m in fed.capture.messages("error") if m.sender == misfit]
    assert {(m.code, m.reason) for m in refusals} == {
        ("data_mismatch", "labels 12 lie outside the federation's 10 classes 0..9")
    }
    chosen = {
        m.round: set(m.selected) for _, m in fed.capture.messages("selection_result")
    }
    assert sorted(chosen) == [1, 2, 3]
    assert all(misfit not in s and len(s) == 2 for s in chosen.values())
    assert fed.clients[misfit].sits_out
    assert not any(fed.clients[d].sits_out for d in others)
