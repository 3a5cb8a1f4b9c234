"""`ursa bench store`: the coordinator store's cost per message, by commit mode.

Replays, on a real `CoordinatorStore` file (WAL, ``synchronous=NORMAL``), the
store calls the coordinator's inbox makes for each message: the duplicate
check, one unit of work with the handler's record, the ``seen`` row where
the message has no natural key, and the commit. Two message kinds:

    volunteer   Dubhe's `Volunteer` (a method row under (round, device)), the
                message every round is made of
    heartbeat   a message with no record of its own (only a ``seen`` row)

and two modes, side by side in one run:

    every       a commit per message and a ``seen`` row for every message
                (the store before group commit, issue 17)
    batched     group commit (`CommitPolicy` defaults: 50 ms or 500 writes)
                and natural keys instead of ``seen`` rows

Messages are built before the clock starts; the figures are wall and CPU
microseconds, SQL statements and commits per message. The budget is a count,
not a time: batched, at most one commit per 20 messages (a commit per message
would take 50 ms each to miss it).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ursa.bench.common import Budget, report
from ursa.coordinator.store import CoordinatorStore, NaturalKey
from ursa.coordinator.store_batches import CommitPolicy
from ursa.protocol.messages import BaseMessage, Heartbeat, Volunteer

__all__ = ["MODES", "StoreRun", "measure", "run"]

MODES = ("every", "batched")
KINDS = ("volunteer", "heartbeat")
_FED = "bench"
_METHOD = "bench"
_DEVICES_PER_ROUND = 1_000
MAX_BATCHED_COMMITS_PER_MESSAGE = 0.05


@dataclass(frozen=True)
class StoreRun:
    """One mode's figures for one kind of message."""

    mode: str
    kind: str
    messages: int
    wall_us: float
    cpu_us: float
    statements: float
    commits: float


def _messages(kind: str, count: int) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(count):
        device = f"d{i % _DEVICES_PER_ROUND:05d}"
        round_index = 1 + i // _DEVICES_PER_ROUND
        if kind == "volunteer":
            out.append(
                Volunteer(
                    federation=_FED,
                    round=round_index,
                    sender=device,
                    draws=(True, False, True),
                )
            )
        else:
            out.append(
                Heartbeat(federation=_FED, round=round_index, sender=device, seq=i)
            )
    return out


def _natural_key(message: BaseMessage) -> NaturalKey | None:
    """A volunteer's row, as a selection method keeps one per device and round."""
    if not isinstance(message, Volunteer):
        return None
    return NaturalKey.method_row(_METHOD, f"volunteers.{message.round}", message.sender)


def _handle(store: CoordinatorStore, message: BaseMessage, natural_keys: bool) -> None:
    """What the coordinator's inbox asks of the store for one message."""
    natural = _natural_key(message) if natural_keys else None
    if store.is_duplicate(message.message_id, natural):
        return
    with store.transaction():
        if isinstance(message, Volunteer):
            draws = json.dumps(list(message.draws)).encode()
            key = f"volunteers.{message.round}"
            store.add_method_row(_METHOD, key, message.sender, draws)
        if natural is None:
            store.mark_seen(message.message_id, 0.0)


def measure(
    mode: str,
    kind: str,
    count: int,
    directory: Path,
    *,
    batched_policy: CommitPolicy | None = None,
) -> StoreRun:
    """Replay ``count`` messages of ``kind`` into a fresh store in ``mode``.

    ``batched_policy``: the batched mode's `CommitPolicy` (default: defaults).
    """
    batched = mode == "batched"
    policy = (batched_policy or CommitPolicy()) if batched else CommitPolicy.every()
    messages = _messages(kind, count)
    store = CoordinatorStore(directory / f"{mode}-{kind}.sqlite3", commit=policy)
    try:
        rounds = 1 + (count - 1) // _DEVICES_PER_ROUND
        for r in range(1, rounds + 1):
            store.add_round(r, 1, b"announce")
        store.flush()
        before = store.stats()
        wall, cpu = time.perf_counter(), time.process_time()
        for message in messages:
            _handle(store, message, batched)
        store.flush()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = store.stats()
    finally:
        store.close()
    return StoreRun(
        mode,
        kind,
        count,
        wall / count * 1e6,
        cpu / count * 1e6,
        (after.statements - before.statements) / count,
        (after.commits - before.commits) / count,
    )


def run(
    *, as_json: bool = False, messages: int = 20_000, modes: Sequence[str] = MODES
) -> int:
    """Print each mode's per-message store cost side by side; 1 on a missed budget."""
    figures: dict[str, object] = {"messages": messages}
    with tempfile.TemporaryDirectory(prefix="ursa-bench-store-") as tmp:
        for kind in KINDS:
            for mode in modes:
                result = measure(mode, kind, messages, Path(tmp))
                prefix = f"{kind}_{mode}"
                figures[f"{prefix}_us_per_message"] = round(result.wall_us, 2)
                figures[f"{prefix}_cpu_us_per_message"] = round(result.cpu_us, 2)
                figures[f"{prefix}_statements_per_message"] = round(
                    result.statements, 3
                )
                figures[f"{prefix}_commits_per_message"] = round(result.commits, 4)
    budgets: list[Budget] = []
    for kind in KINDS:
        if "batched" in modes:
            key = f"{kind}_batched_commits_per_message"
            budgets.append(Budget(key, at_most=MAX_BATCHED_COMMITS_PER_MESSAGE))
        if set(MODES) <= set(modes):
            wall_every = figures[f"{kind}_every_us_per_message"]
            wall_batched = figures[f"{kind}_batched_us_per_message"]
            assert isinstance(wall_every, float) and isinstance(wall_batched, float)
            figures[f"{kind}_batched_speedup"] = round(
                wall_every / max(wall_batched, 1e-9), 2
            )
    return report(
        f"coordinator store, per inbound message ({messages} messages per run)",
        figures,
        budgets,
        as_json=as_json,
    )
