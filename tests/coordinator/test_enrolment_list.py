"""The operator's enrolment list (``enrolment.json``): pins, revocations, merging."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from ursa.coordinator.config import EnrolmentConfig, SelectionConfig
from ursa.coordinator.enrolment_list import (
    ENROLMENT_FILENAME,
    EnrolmentList,
    EnrolmentListError,
    EnrolmentWatch,
    normalise_fingerprint,
)
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity

FP_A = "0123456789abcdef0123456789abcdef"
FP_B = "fedcba9876543210fedcba9876543210"


def test_missing_file_is_an_empty_list(tmp_path: Path) -> None:
    assert EnrolmentList.load(tmp_path) == EnrolmentList()


def test_enrol_and_revoke_round_trip_through_the_file(tmp_path: Path) -> None:
    listed = EnrolmentList().enrol("a", FP_A.upper()).enrol("b", FP_B)
    listed = listed.revoke("b")
    path = listed.save(tmp_path / "state")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = EnrolmentList.load(tmp_path / "state")
    assert loaded == listed
    assert (loaded.pins, loaded.revoked) == ({"a": FP_A}, frozenset({"b"}))
    again = loaded.enrol("b", FP_B)  # enrolling again lifts the revocation
    assert (again.pins["b"], again.revoked) == (FP_B, frozenset())


@pytest.mark.parametrize("bad", ["0123", "g" * 32, FP_A + "0"])
def test_bad_fingerprints_are_refused(bad: str) -> None:
    with pytest.raises(EnrolmentListError, match="32 hex digits"):
        EnrolmentList().enrol("a", bad)


def test_fingerprints_may_be_grouped() -> None:
    grouped = ":".join(FP_A[i : i + 4] for i in range(0, 32, 4))
    assert normalise_fingerprint(grouped.upper()) == FP_A


def test_bad_device_ids_and_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(EnrolmentListError, match="not a device id"):
        EnrolmentList().revoke("a/b")
    (tmp_path / ENROLMENT_FILENAME).write_text(json.dumps({"pins": {"a": "x"}}))
    with pytest.raises(EnrolmentListError, match=ENROLMENT_FILENAME):
        EnrolmentList.load(tmp_path)
    (tmp_path / ENROLMENT_FILENAME).write_text("{")
    with pytest.raises(EnrolmentListError):
        EnrolmentList.load(tmp_path)


def test_policy_adds_pins_and_drops_revoked() -> None:
    config = EnrolmentConfig(pins={"a": FP_B, "c": FP_B})
    listed = EnrolmentList().enrol("a", FP_A).revoke("c")
    policy = listed.policy(config)
    assert policy.mode == "pinned"
    assert policy.pins == {"a": FP_A}


def test_stale_devices_are_the_revoked_and_the_re_enrolled() -> None:
    listed = EnrolmentList().enrol("a", FP_A).enrol("b", FP_A).revoke("c")
    enrolled = {"a": FP_A, "b": FP_B, "c": FP_A, "d": FP_B}
    assert listed.stale_devices(enrolled) == {
        "b": "enrolled again with other keys",
        "c": "revoked",
    }


# --- the coordinator honours the list -------------------------------------------


def _fingerprint(fed: Any, device_id: str) -> str:
    """Create the device's identity in its state dir, as `ursa device identity`."""
    identity = DeviceIdentity.load_or_create(fed.tmp_path / device_id, device_id)
    return identity.public().fingerprint()


def test_a_running_coordinator_admits_devices_enrolled_by_command(
    federation: Any,
) -> None:
    fed = federation(num_devices=3, k=2, rounds=1, enrolment=EnrolmentConfig())
    fed.coordinator.start()
    d0, d1, d2 = fed.device_ids
    fed.new_device(d0).start()
    assert not fed.devices[d0].enrolled.is_set()  # pinned, and not on any list

    listed = EnrolmentList()
    for device_id in (d1, d2):
        listed = listed.enrol(device_id, _fingerprint(fed, device_id))
    listed.save(fed.config.state_dir)
    for device_id in (d1, d2):
        fed.new_device(device_id).start()

    assert fed.devices[d1].enrolled.is_set() and fed.devices[d2].enrolled.is_set()
    assert set(fed.coordinator.store.enrolled()) == {d1, d2}
    errors = fed.coordinator.store.recent_errors()
    assert {e.device for e in errors} == {d0}
    refusals = [e.reason for e in errors if (e.what, e.code) == ("hello", "refused")]
    assert set(refusals) == {"device id is not on the enrolment list"}


def test_a_revoked_device_is_refused_and_forgotten_at_the_next_start(
    federation: Any,
) -> None:
    fed = federation(num_devices=3, k=2, rounds=1)  # TOFU
    fed.start()
    d0 = fed.device_ids[0]
    EnrolmentList().revoke(d0).save(fed.config.state_dir)

    fed.devices[d0].stop()
    fed.new_device(d0).start()  # its Hello is refused at once
    assert not fed.devices[d0].enrolled.is_set()
    assert d0 in fed.coordinator.store.enrolled()  # until the next start

    fed.coordinator.stop()
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    assert d0 not in fed.coordinator.store.enrolled()
    assert d0 not in fed.coordinator.store.online()
    fed.devices[d0].stop()
    fed.new_device(d0).start()
    assert not fed.devices[d0].enrolled.is_set()
    reasons = [e.reason for e in fed.coordinator.store.recent_errors()]
    assert reasons[0] == "enrolment of this device id was revoked"


def test_a_device_enrolled_again_with_new_keys_replaces_its_old_identity(
    federation: Any,
) -> None:
    fed = federation(num_devices=3, k=2, rounds=1)  # TOFU: the first key won
    fed.start()
    d0 = fed.device_ids[0]
    fed.devices[d0].stop()
    (fed.tmp_path / d0 / "identity.key").unlink()  # the device lost its state
    new = _fingerprint(fed, d0)
    EnrolmentList().enrol(d0, new).save(fed.config.state_dir)

    fed.coordinator.stop()
    fed.coordinator = fed.new_coordinator()
    fed.coordinator.start()
    fed.new_device(d0).start()

    assert fed.devices[d0].enrolled.is_set()
    stored = DevicePublicIdentity.from_bytes(fed.coordinator.store.enrolled()[d0])
    assert stored.fingerprint() == new


def test_the_watch_reads_the_file_only_when_it_changed(tmp_path: Path) -> None:
    watch = EnrolmentWatch(tmp_path, EnrolmentConfig(mode="pinned"))
    assert watch.current() == (EnrolmentList(), EnrolmentConfig(mode="pinned"))
    for _ in range(5):
        watch.current()
    assert watch.reads == 1  # one stat per Hello, no parse
    EnrolmentList().enrol("a", FP_A).save(tmp_path)
    listed, policy = watch.current()
    watch.current()
    assert watch.reads == 2 and policy.pins == {"a": FP_A}
    EnrolmentList().enrol("a", FP_A).revoke("b").save(tmp_path)
    listed, _ = watch.current()
    assert listed.revoked == {"b"}


def test_a_broken_file_keeps_the_list_read_before(tmp_path: Path) -> None:
    EnrolmentList().enrol("a", FP_A).revoke("b").save(tmp_path)
    watch = EnrolmentWatch(tmp_path, EnrolmentConfig())
    watch.current()
    (tmp_path / "enrolment.json").write_text("{not json")
    listed, policy = watch.current()
    assert listed.revoked == {"b"} and policy.pins == {"a": FP_A}


def test_revoking_a_key_holder_while_running_keys_again_without_it(
    federation: Any,
) -> None:
    fed = federation(  # silence means no: the rounds wait, the test steps in
        num_devices=4,
        k=2,
        rounds=6,
        min_devices=3,
        selection=SelectionConfig(explicit_replies_below=0),
    )
    fed.start(settle=False)
    for _ in range(100):  # run into the federation, not to its end
        if fed.coordinator.store.completed_rounds() >= 1:
            break
        fed.tick(fed.config.deadlines.volunteer_s)
    assert 1 <= fed.coordinator.store.completed_rounds() < 6
    epoch = fed.coordinator.state.epoch
    (_, first), *_ = fed.messages("key_epoch_start")
    revoked = next(d for d in fed.device_ids if d != first.agent)
    EnrolmentList().revoke(revoked).save(fed.config.state_dir)
    fed.tick(0.0)
    fed.settle()
    assert fed.coordinator.store.completed_rounds() == 6

    assert revoked not in fed.coordinator.store.enrolled()  # forgotten, no restart
    starts = [m for _, m in fed.messages("key_epoch_start")]
    assert starts[-1].epoch > epoch  # a new key epoch ...
    sealed_to = {
        r.device_id
        for _, page in fed.messages("seal_request")
        if page.epoch == starts[-1].epoch
        for r in page.recipients
    }
    assert sealed_to and revoked not in sealed_to  # ... that leaves it out
    assert starts[-1].agent != revoked
    later = [m for _, m in fed.messages("round_announce") if m.epoch > epoch]
    assert later, "the rounds after the revocation run in the new key epoch"


def test_a_revocation_of_a_device_outside_the_epoch_keys_nothing(
    federation: Any,
) -> None:
    fed = federation(num_devices=4, k=2, rounds=2)
    fed.start()
    epochs = len(fed.messages("key_epoch_start"))
    EnrolmentList().revoke("never-seen").save(fed.config.state_dir)
    fed.tick(0.0)
    fed.settle()
    assert len(fed.messages("key_epoch_start")) == epochs
