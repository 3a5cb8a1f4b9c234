"""`ursa bench coordinator`: the coordinator's cost per message and round, to 100,000.

Per size (each in a fresh process, so its RSS is its own): the coordinator
that `ursa coordinator serve` builds, with its real SQLite store, on the
in-memory transport; N simulated devices pinned through the enrolment list
(as `ursa coordinator enrol` writes it) say Hello and publish their online
status; a key epoch (the bench plays the agent: a Paillier key, every
`SealRequest` page answered with sealed keys, the signed public key; every
recipient registers); then the selection rounds (Dubhe with H tries; the
devices whose draws are True volunteer, the tries' members send their
encrypted distributions, the agent answers). `ursa.bench.coordinator_run`
says how time and CPU are measured; `ursa.bench.coordinator_fleet` what the
devices do.

Devices' ciphertexts come from a pool (``--pool``, default 64) of distinct
registries and distributions encrypted once per key epoch and reused: the
coordinator only checks and sums ciphertexts. Identity keys, sealed boxes
and signatures are each device's own. Generating them is not measured.

Figures per size: ``key_epoch_cpu_s``, ``coordinator_cpu_s_per_round``,
``coordinator_inbound_per_round``, ``us_per_inbound_message`` (round CPU per
inbound round message), ``rss_mib`` (peak RSS of the size's process, the
simulated fleet included; ``coordinator_rss_mib``: its growth after the
fleet was generated), ``replies`` (the rule the size's rounds ran: the
coordinator's default ``[selection] explicit_replies_below`` puts a fleet
under 2,000 in ``explicit`` replies, where every device answers, and larger
ones in ``silence``). Targets of issues 17 and 33, as ratios: the per-round
CPU at the largest size at most 3x the smallest's, ``us_per_inbound_message``
within 2x across the sizes that ran the largest's rule (an explicit round's
many one-line answers are cheaper per message than a silent round's few
ciphertexts: comparing them would measure the mix, not the growth), a round
at 100,000 devices under 1 s of CPU and with at most 1.5 x 2·H·K inbound
messages (H·K volunteers at most, and the tries' distributions).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from multiprocessing.connection import Connection
from typing import Any, Literal, TextIO

from ursa.bench.common import Budget, check_budgets
from ursa.bench.coordinator_run import SizeSettings

__all__ = ["TARGETS", "parse_sizes", "run", "targets"]

TARGETS = [
    Budget("cpu_per_round_ratio", at_most=3.0),
    Budget("us_per_inbound_ratio", at_most=2.0),
    Budget("round_cpu_s_at_100000", at_most=1.0),
    Budget("inbound_per_2hk_at_100000", at_most=1.5),
]
"""Issues 17 and 33's targets (``cpu_per_round_ratio``: largest size over
smallest; ``inbound_per_2hk_at_100000``: inbound per round over 2·H·K)."""
POOL_NOTE = (
    "device ciphertexts come from a pool of distinct registries and "
    "distributions encrypted once per key epoch and reused (the coordinator "
    "only checks and sums them); identities, sealed keys and signatures are "
    "per device"
)


def parse_sizes(text: str) -> list[int]:
    """``"1000,10000"`` -> ``[1000, 10000]`` (each at least 2).

    Raises:
        ValueError: not a comma-separated list of integers >= 2.
    """
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 2:
        raise ValueError("--devices takes sizes >= 2, e.g. 1000,10000,100000")
    return sizes


def _child(settings: SizeSettings, conn: Connection) -> None:
    """One size in a fresh process: its phases as they start, then its figures."""
    from ursa.bench.coordinator_run import measure_size

    try:
        result = measure_size(settings, lambda phase: conn.send({"phase": phase}))
    except Exception as exc:  # reported as the size's error, never a crash
        result = {"devices": settings.devices, "error": f"{type(exc).__name__}: {exc}"}
    conn.send(result)
    conn.close()


def _measure_in_process(settings: SizeSettings, timeout_s: float) -> dict[str, Any]:
    """Run one size in a spawned process, killed after ``timeout_s``."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(settings, send), daemon=True)
    process.start()
    send.close()
    deadline = time.monotonic() + timeout_s
    phase = "start"
    result: dict[str, Any] | None = None
    try:
        while result is None and receive.poll(max(0.0, deadline - time.monotonic())):
            message: dict[str, Any] = receive.recv()
            if set(message) == {"phase"}:
                phase = str(message["phase"])
            else:
                result = message
    except EOFError:
        result = {"devices": settings.devices, "error": f"died in phase {phase}"}
    finally:
        receive.close()
        if process.is_alive():
            process.kill()
        process.join()
    if result is None:
        hint = ""
        if phase == "enrolment" and settings.enrolment == "pinned":
            hint = " (pinned enrolment: see --enrolment tofu)"
        result = {
            "devices": settings.devices,
            "error": f"timed out after {timeout_s:.0f} s in phase {phase}{hint}",
        }
    return result


def targets(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Issue 17's targets as ratios over the completed sizes (absent: unmeasurable)."""
    done = sorted(
        (r for r in runs if "error" not in r and r.get("rounds_completed")),
        key=lambda r: int(r["devices"]),
    )
    out: dict[str, float] = {}
    if len(done) >= 2:
        small, large = done[0], done[-1]
        base = float(small["coordinator_cpu_s_per_round"])
        if base > 0:
            out["cpu_per_round_ratio"] = (
                float(large["coordinator_cpu_s_per_round"]) / base
            )
        rule = large.get("replies")
        costs = [
            float(r["us_per_inbound_message"]) for r in done if r.get("replies") == rule
        ]
        if len(costs) >= 2 and min(costs) > 0:
            out["us_per_inbound_ratio"] = max(costs) / min(costs)
    for r in done:
        if int(r["devices"]) == 100_000:
            out["round_cpu_s_at_100000"] = float(r["coordinator_cpu_s_per_round"])
            two_hk = 2 * int(r["tries"]) * int(r["k"])
            out["inbound_per_2hk_at_100000"] = (
                float(r["coordinator_inbound_per_round"]) / two_hk
            )
    return out


def run(
    *,
    as_json: bool,
    devices: Sequence[int] = (1000, 10_000, 100_000),
    k: int = 20,
    tries: int = 5,
    rounds: int = 3,
    key_bits: int = 2048,
    pool: int = 64,
    enrolment: Literal["pinned", "tofu"] = "pinned",
    all_volunteer: bool = False,
    explicit_replies_below: int | None = None,
    timeout_s: float = 3600.0,
    out: TextIO | None = None,
) -> int:
    """Measure each size; print JSON or a table; 1 on a failed size or missed target."""
    out = out if out is not None else sys.stdout
    base = SizeSettings(
        devices=2,
        k=k,
        tries=tries,
        rounds=rounds,
        key_bits=key_bits,
        pool=pool,
        enrolment=enrolment,
        all_volunteer=all_volunteer,
        explicit_replies_below=explicit_replies_below,
    )
    runs = []
    for size in devices:
        result = _measure_in_process(replace(base, devices=size), timeout_s)
        runs.append(result)
        if not as_json:
            out.write(f"  {_describe(result)}\n")
            out.flush()
    ratios = targets(runs)
    present = [b for b in TARGETS if b.key in ratios]
    missed = check_budgets(ratios, present)
    failed = [r for r in runs if "error" in r or r.get("rounds_completed") != rounds]
    report = {
        "runs": runs,
        "targets": ratios,
        "target_limits": {b.key: b.describe() for b in TARGETS},
        "targets_met": (not missed) if present else None,
        "settings": {
            key: value for key, value in asdict(base).items() if key != "devices"
        },
        "note": POOL_NOTE,
    }
    if as_json:
        out.write(json.dumps(report) + "\n")
    else:
        _table(report, missed, out)
    return 1 if missed or failed else 0


def _describe(result: Mapping[str, Any]) -> str:
    if "error" in result:
        return f"{result['devices']:>7,} devices: {result['error']}"
    return (
        f"{result['devices']:>7,} devices: round "
        f"{result['coordinator_cpu_s_per_round']:.4g} s CPU, "
        f"{result['coordinator_inbound_per_round']:.0f} inbound, "
        f"{result['us_per_inbound_message']:.0f} us/message, "
        f"{result.get('replies', '?')} replies"
    )


def _table(report: Mapping[str, Any], missed: list[str], out: TextIO) -> None:
    out.write("ursa bench coordinator\n")
    header = (
        f"  {'devices':>8}  {'key epoch CPU s':>15}  {'round CPU s':>11}  "
        f"{'inbound/round':>13}  {'us/message':>10}  {'RSS MiB':>8}  replies\n"
    )
    out.write(header)
    for r in report["runs"]:
        if "error" in r:
            out.write(f"  {r['devices']:>8,}  {r['error']}\n")
            continue
        out.write(
            f"  {r['devices']:>8,}  {r['key_epoch_cpu_s']:>15.4g}  "
            f"{r['coordinator_cpu_s_per_round']:>11.4g}  "
            f"{r['coordinator_inbound_per_round']:>13.1f}  "
            f"{r['us_per_inbound_message']:>10.1f}  {r['rss_mib']:>8.1f}  "
            f"{r.get('replies', '?')}\n"
        )
    limits = report["target_limits"]
    for key, value in report["targets"].items():
        flag = "  MISSED" if key in missed else ""
        out.write(f"  target {key}: {value:.3g} ({limits[key]}){flag}\n")
    out.write(f"  ({report['note']})\n")
