"""Who owns the broker's files: Mosquitto reads them as its own system user.

Mosquitto 2 drops to its `user` (``mosquitto`` on Debian) before it reads the
password file, the ACL and the TLS key, and refuses files it cannot read; its
persistence and log directories must be writable by that user. Run as root,
the generator hands those files to the user; run as that user itself, nothing
changes hands; run as anyone else, it cannot, and `OwnerPlan.commands` are
the root commands that finish the job.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["OwnerError", "OwnerPlan", "plan_owner"]


class OwnerError(ValueError):
    """The system user does not exist and the files must be handed to it now."""


@dataclass
class OwnerPlan:
    """Hands files and directories to `user`, or collects the commands to do it.

    `ids` is (uid, gid) when this process may chown to the user (it is root, or
    it is the user), else None and `commands` gather what root must run.
    """

    user: str
    ids: tuple[int, int] | None
    group: str = ""
    """The user's login group (default: named like the user)."""
    commands: list[str] = field(default_factory=list)
    _chown_later: list[str] = field(default_factory=list)

    def give(self, path: Path, install_path: Path) -> None:
        """Make `path` (installed as `install_path`) the user's."""
        if self.ids is not None:
            os.chown(path, *self.ids)
        else:
            self._chown_later.append(str(install_path))

    def make_dir(self, path: Path, *, local: bool) -> None:
        """Create a 0700 directory of the user's (here if `local`, else later)."""
        if local and self.ids is not None:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chown(path, *self.ids)
            return
        self.commands.append(
            f"install -d -o {shlex.quote(self.user)} "
            f"-g {shlex.quote(self.group or self.user)} "
            f"-m 0700 {shlex.quote(str(path))}"
        )

    def finish(self) -> list[str]:
        """Return the root commands still needed (empty when all is done)."""
        if self._chown_later:
            paths = " ".join(shlex.quote(p) for p in self._chown_later)
            self.commands.insert(0, f"chown {shlex.quote(self.user)}: {paths}")
            self._chown_later.clear()
        return list(self.commands)


def plan_owner(user: str) -> OwnerPlan:
    """Return the plan for handing files to system user `user`.

    Raises:
        OwnerError: `user` does not exist and this process is root (it would
            write files nobody can use); as non-root the chown is left to the
            printed commands, which fail loudly on the broker host if wrong.
    """
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        if os.geteuid() == 0:
            raise OwnerError(
                f"no system user {user!r} (installing mosquitto creates "
                "'mosquitto'; or pass --user)"
            ) from None
        return OwnerPlan(user, None)
    try:
        group = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        group = user
    if os.geteuid() in (0, entry.pw_uid):
        return OwnerPlan(user, (entry.pw_uid, entry.pw_gid), group)
    return OwnerPlan(user, None, group)
