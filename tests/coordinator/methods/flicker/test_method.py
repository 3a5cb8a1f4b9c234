"""FLICKER inside `CoordinatorService` and `EdgeClient`, over the in-memory bus.

One federation, one session per device: the run sits between enrolment and
the first key epoch, devices register their resampled labels, and a killed
coordinator resumes the run from its store.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest

from ursa.coordinator.methods.flicker.keyfile import CKKS_KEY_FILENAME
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods_config import DubheSpec, FlickerSpec
from ursa.coordinator.round_state import Stage
from ursa.edge_sdk import methods_config as device_methods
from ursa.edge_sdk.config import DeviceConfig
from ursa.edge_sdk.methods.flicker.method import Flicker
from ursa.protocol.envelope import decode
from ursa.protocol.topics import bridge_state_topic

pytest.importorskip("tenseal")

N = 5
METHODS = (DubheSpec(), FlickerSpec(reply_deadline_s=30.0))


def _flicker_federation(federation: Any) -> Any:
    fed = federation(num_devices=N, k=2, tries=2, rounds=2, methods=METHODS)
    plain = fed.device_config

    def device_config(device_id: str) -> DeviceConfig:
        methods = (device_methods.DubheDeviceSpec(), device_methods.FlickerDeviceSpec())
        return plain(device_id).model_copy(update={"methods": methods})

    fed.device_config = device_config
    return fed


def _final_counts(client: Any) -> tuple[int, ...]:
    participant = client.method(Flicker).participant
    assert participant is not None
    counts: tuple[int, ...] = participant.counts
    return counts


def _kinds(fed: Any) -> list[str]:
    return [decode(payload).kind for _, payload in fed.captured if payload]


def test_flicker_runs_after_enrolment_and_devices_register_resampled_labels(
    federation: Any,
) -> None:
    fed = _flicker_federation(federation)

    fed.start()

    kinds = _kinds(fed)
    assert fed.coordinator.is_done
    assert kinds.index("ring_start") < kinds.index("key_epoch_start")
    assert kinds.index("count_update") < kinds.index("key_epoch_start")
    flicker = fed.coordinator.balancing
    assert flicker is not None
    summary = flicker.summary()
    assert summary["phase"] == "done" and summary["resampled_devices"]
    assert summary["gi_after"] > summary["gi_before"]
    for device_id in summary["resampled_devices"]:
        client = fed.devices[device_id]
        assert client.method(Flicker).has_resampled
        participant = client.method(Flicker).participant
        assert participant is not None
        counts = np.bincount(client.data.labels, minlength=10)
        assert tuple(int(c) for c in counts) == participant.counts
    starts = [m for _, m in fed.messages("ring_start")]
    assert all(m.signature and len(m.members) == len(m.order) for m in starts)
    store = fed.coordinator.store
    assert store.method_state("flicker", "run")["phase"] == "done"
    key_file = fed.config.state_dir / CKKS_KEY_FILENAME
    assert os.stat(key_file).st_mode & 0o777 == 0o600
    epochs = [m for _, m in fed.messages("key_epoch_start")]
    assert {m.methods for m in epochs} == {("dubhe", "flicker")}


def test_a_coordinator_killed_mid_resampling_resumes_the_same_run(
    federation: Any,
) -> None:
    fed = _flicker_federation(federation)

    def lose_count_updates(sender: Any, receiver: Any, topic: str, data: bytes) -> bool:
        return receiver == "coordinator" and decode(data).kind == "count_update"

    fed.bus.drop_filter = lose_count_updates
    fed.start()
    assert fed.coordinator.state.stage is Stage.BALANCING
    assert fed.coordinator.store.method_state("flicker", "run")["phase"] == "resample"

    fed.coordinator_transport.kill()  # kill -9: no clean shutdown
    fed.coordinator.store.close()
    fed.bus.drop_filter = None
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()

    assert fed.coordinator.is_done
    ring_ids = {m.ring_id for _, m in fed.messages("ring_start")}
    assert len(ring_ids) == 1, "the run resumed, it did not start again"
    assert len(fed.messages("enrol_result")) == N
    flicker = fed.coordinator.balancing
    assert flicker is not None
    summary = flicker.summary()
    assert summary["phase"] == "done" and summary["resampled_devices"]
    # Enc(GD) went through the store as bytes and got the resumed updates added:
    # it decrypts to the plaintext sum of the devices' final counts
    finals = [_final_counts(c) for c in fed.devices.values()]
    assert summary["global_counts_after"] == np.sum(finals, axis=0).tolist()


def test_the_method_table_builds_flicker_only_where_methods_name_it(
    tmp_path: Path,
) -> None:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.coordinator.method_context import MethodContext
    from ursa.coordinator.methods.registry import balancing_method

    plain = CoordinatorConfig(federation="f", state_dir=tmp_path)
    config = CoordinatorConfig(federation="f", state_dir=tmp_path, methods=METHODS)
    context = cast(MethodContext, SimpleNamespace(federation="f"))  # store unread

    assert balancing_method(plain, context) is None
    built = balancing_method(config, context)
    assert isinstance(built, FlickerMethod)
    assert built.config.federation == "f"
    assert built.config.reply_deadline_s == 30.0
    assert built.config.num_classes == config.registry.num_classes
    assert (tmp_path / CKKS_KEY_FILENAME).exists()  # its key, made when built


def _lose_the_first_relayed_hop(fed: Any) -> list[str]:
    """Drop the first hop the coordinator relays; the device it was for."""
    lost: list[str] = []

    def drop(sender: Any, receiver: Any, topic: str, data: bytes) -> bool:
        relayed = sender == "coordinator" and receiver in fed.device_ids
        if relayed and not lost and decode(data).kind == "ring_hop":
            lost.append(receiver)
            return True
        return False

    fed.bus.drop_filter = drop
    return lost


def test_a_link_outage_gives_the_ring_holder_its_time_back(federation: Any) -> None:
    fed = _flicker_federation(federation)
    lost = _lose_the_first_relayed_hop(fed)
    fed.start()
    assert lost and fed.coordinator.state.stage is Stage.BALANCING
    flicker = fed.coordinator.balancing
    assert isinstance(flicker, FlickerMethod)
    hop_s, outage_s = flicker.config.hop_deadline_s, 10.0

    link = bridge_state_topic("site-a")
    fed.raw.publish(link, b"1")
    fed.raw.publish(link, b"0")
    fed.clock.advance(outage_s)
    fed.raw.publish(link, b"1")  # back: every live phase gets the 10 s back
    fed.tick(hop_s - outage_s + 1)  # past the holder's first deadline

    outcome = flicker.outcome()
    assert outcome is not None and outcome.skipped == ()
    fed.tick(outage_s)
    outcome = flicker.outcome()
    assert outcome is not None and outcome.skipped == (lost[0],)


def test_a_ring_member_whose_last_will_arrives_is_skipped_without_waiting(
    federation: Any,
) -> None:
    fed = _flicker_federation(federation)
    lost = _lose_the_first_relayed_hop(fed)
    fed.start()
    assert lost and fed.coordinator.state.stage is Stage.BALANCING

    fed.transports[lost[0]].kill()  # its last will says offline; no clock moves

    flicker = fed.coordinator.balancing
    assert isinstance(flicker, FlickerMethod)
    outcome = flicker.outcome()
    assert outcome is not None and outcome.skipped == (lost[0],)
    assert lost[0] not in outcome.contributors
    assert fed.coordinator.state.stage is Stage.ENROLMENT  # 4 < min_devices=5
    fed.new_device(lost[0]).start()
    assert fed.coordinator.is_done
