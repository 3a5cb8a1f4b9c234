"""A finished run on disk: not served again; ``new-run`` archives it, keeping the pins.

A store is one run of the federation (`CoordinatorStore.run_id`). Once its
rounds are done (the stage DONE) there is nothing left to serve: ``ursa
coordinator serve`` says so (`finished_round`) instead of waiting for a
fleet that has gone home. ``ursa coordinator new-run`` (`start_new_run`)
moves the run's database (and the default ``final`` folder) to
``<state_dir>/runs/<run id>/`` and opens a fresh store that carries the
enrolled devices over (their identity keys and operator certificates, the
TOFU pins). The coordinator's identity key, ``enrolment.json`` and the
operator trust are files beside the database and stay as they are, so every
device follows the new run by itself: a message of a run it never joined
makes it say Hello, and the signed acceptance names the new run
(docs/protocol.md, "Version 4: runs").
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ursa.coordinator.round_state import RoundState, Stage
from ursa.coordinator.stage_machine import STATE_KEY
from ursa.coordinator.store import DB_FILENAME, CoordinatorStore
from ursa.crypto.identity import DevicePublicIdentity

__all__ = [
    "RUNS_DIRNAME",
    "NewRun",
    "NewRunError",
    "finished_round",
    "start_new_run",
]

logger = logging.getLogger("ursa.coordinator")

RUNS_DIRNAME = "runs"
"""Under the state dir: one folder per archived run, named by its run id."""

_SIDE_FILES = ("-wal", "-shm", "-journal")
"""SQLite's companions of the database file (moved with it)."""


class NewRunError(Exception):
    """A new run cannot start on this store (the text says why and what to do)."""


@dataclass(frozen=True)
class NewRun:
    """What `start_new_run` did."""

    old_run: str
    new_run: str
    archive: Path
    """Where the old run's database (and default final model) went."""
    devices: int
    """Enrolled devices carried over to the new run."""


def _state(store: CoordinatorStore) -> RoundState | None:
    raw = store.get_meta(STATE_KEY)
    return None if raw is None else RoundState.from_json(json.loads(raw))


def finished_round(state_dir: Path) -> int | None:
    """The rounds completed, if the store in ``state_dir`` holds a finished run.

    None when there is no store yet or its federation is not over.
    """
    path = Path(state_dir) / DB_FILENAME
    if not path.exists():
        return None
    store = CoordinatorStore(path)
    try:
        state = _state(store)
        if state is None or state.stage is not Stage.DONE:
            return None
        return store.completed_rounds()
    finally:
        store.close()


def start_new_run(
    state_dir: Path, *, final_dir: Path | None = None, abandon: bool = False
) -> NewRun:
    """Archive the store's run and open a new one with the same enrolled devices.

    Args:
        state_dir: The coordinator's state dir (its process must be stopped).
        final_dir: The final model's folder when it is the default
            ``<state_dir>/final`` (archived with the run); None leaves it.
        abandon: Also end a run whose federation is not over.

    Raises:
        NewRunError: no store yet, or its run is not finished (and not
            ``abandon``).
    """
    state_dir = Path(state_dir)
    path = state_dir / DB_FILENAME
    if not path.exists():
        raise NewRunError(
            f"no store in {state_dir}: `ursa coordinator serve` starts the first run"
        )
    store = CoordinatorStore(path)
    try:
        old_run = store.run_id()
        state = _state(store)
        if not abandon and (state is None or state.stage is not Stage.DONE):
            where = (
                "before its first round"
                if state is None
                else (f"at round {state.round} ({state.stage})")
            )
            raise NewRunError(
                f"run {old_run} is not finished ({where}); stop its coordinator "
                "and pass --abandon to end it"
            )
        identities = store.enrolled()
        certificates = store.certificates()
    finally:
        store.close()
    archive = state_dir / RUNS_DIRNAME / old_run
    archive.mkdir(parents=True, exist_ok=True, mode=0o700)
    for suffix in ("", *_SIDE_FILES):
        part = path.with_name(path.name + suffix)
        if part.exists():
            shutil.move(str(part), str(archive / part.name))
    if final_dir is not None and final_dir.exists():
        shutil.move(str(final_dir), str(archive / final_dir.name))
    fresh = CoordinatorStore(path)
    try:
        now = time.time()
        with fresh.transaction():
            for device, identity in sorted(identities.items()):
                public = DevicePublicIdentity.from_bytes(identity)
                fresh.enrol(device, identity, public.fingerprint(), now)
                if device in certificates:
                    fresh.set_certificate(device, certificates[device])
        new_run = fresh.run_id()
    finally:
        fresh.close()
    logger.info(
        "run %s archived to %s; new run %s with %d enrolled devices",
        old_run,
        archive,
        new_run,
        len(identities),
    )
    return NewRun(old_run, new_run, archive, len(identities))
