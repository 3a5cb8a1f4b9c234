"""Handing the broker's files to Mosquitto's system user."""

from __future__ import annotations

import getpass
import grp
import os
import pwd
from pathlib import Path

import pytest

from ursa.tools.broker.ownership import OwnerError, OwnerPlan, plan_owner


def test_own_user_is_handed_files_directly(tmp_path: Path) -> None:
    plan = plan_owner(getpass.getuser())
    assert plan.ids == (os.geteuid(), os.getegid())
    assert plan.group == grp.getgrgid(os.getegid()).gr_name
    target = tmp_path / "f"
    target.touch()
    plan.give(target, Path("/etc/x/f"))
    plan.make_dir(tmp_path / "d" / "e", local=True)
    assert (tmp_path / "d" / "e").is_dir()
    assert plan.finish() == []


def test_someone_else_gets_one_chown_and_the_directories_as_commands(
    tmp_path: Path,
) -> None:
    plan = OwnerPlan("mosquitto", None)  # what a non-root operator gets
    for name in ("passwd", "acl"):
        plan.give(tmp_path / name, Path("/etc/ursa/broker") / name)
    plan.make_dir(Path("/srv/mqtt data"), local=True)
    assert plan.finish() == [
        "chown mosquitto: /etc/ursa/broker/passwd /etc/ursa/broker/acl",
        "install -d -o mosquitto -g mosquitto -m 0700 '/srv/mqtt data'",
    ]
    assert not (tmp_path / "passwd").exists()  # nothing touched here


def test_remote_directories_are_left_to_commands_even_for_root(
    tmp_path: Path,
) -> None:
    plan = OwnerPlan("mosquitto", (os.geteuid(), os.getegid()), "nogroup")
    plan.make_dir(tmp_path / "remote", local=False)
    assert not (tmp_path / "remote").exists()
    assert plan.finish() == [
        f"install -d -o mosquitto -g nogroup -m 0700 {tmp_path / 'remote'}"
    ]


def test_a_missing_user_is_an_error_only_for_root() -> None:
    name = "ursa-no-such-user"
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    if os.geteuid() == 0:
        with pytest.raises(OwnerError, match=name):
            plan_owner(name)
    else:
        assert plan_owner(name).ids is None
