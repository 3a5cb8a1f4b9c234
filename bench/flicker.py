"""`ursa bench flicker`: CKKS time per FLICKER protocol step, and bytes per device.

Per device (median of ``repeats`` runs): loading the public context, encrypting
its counts (first ring hop), adding its counts to the running sum (later
hops), opening and re-sealing a hop, the masked cosine product, and the
encrypted count update. On the coordinator: key generation, encrypting
``GD/||GD||``, decrypting ``GD``, a cosine and an update. Then the whole
protocol runs once on table D1 over the in-memory bus (the coordinator's
production `FlickerMethod`, every message encoded as on MQTT, the ring start
signed) and the payload bytes each device sent and received are reported.
Budget: the public context a device downloads is <= 500,000 bytes.
"""

from __future__ import annotations

import time

import numpy as np

from ursa.bench.common import Budget, median_ms, report
from ursa.coordinator.methods.flicker import algorithm as fl
from ursa.crypto.ckks import CkksKeyOwner, CkksPublicContext
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.sealing import open_sealed, seal
from ursa.edge_sdk.methods.flicker import algorithm as dev
from ursa.edge_sdk.methods.flicker.participant import ring_seal_context
from ursa.lab.simulate.flicker_fleet import build_fleet
from ursa.lab.simulate.flicker_tables import get_table
from ursa.protocol.envelope import encode
from ursa.protocol.messages import RingHop

BUDGETS = [Budget("ckks_public_context_bytes", at_most=500_000)]
TABLE = "D1"


def _require(condition: bool, message: str) -> None:
    """Fail loudly when a measured path gives a wrong result."""
    if not condition:
        raise RuntimeError(f"bench flicker: {message}")


def _step_figures(repeats: int) -> dict[str, float | int]:
    counts = np.array(get_table(TABLE))
    mine, others = counts[1], counts[0]
    gd = counts.sum(axis=0)
    keygen_ms = median_ms(CkksKeyOwner, max(1, repeats // 3))
    owner = CkksKeyOwner()
    public = owner.public_context_bytes()
    ctx = CkksPublicContext.from_bytes(public)
    rng = np.random.default_rng(0)
    a, b = DeviceIdentity.generate("dev-a"), DeviceIdentity.generate("dev-b")
    seal_context = ring_seal_context("bench", "ring", 0, ("dev-a",))

    first = dev.encrypt_counts(ctx, others)
    box = seal(a, b.public(), seal_context, first)
    running = dev.add_counts(ctx, first, mine)
    unit = fl.encrypt_normalised_global(ctx, gd)
    reply = dev.similarity_reply(ctx, unit, mine, rng)
    delta = ctx.encrypt(np.array([3.0, 0.0, 0.0, -40.0]))
    updated = ctx.add(running, delta)
    _require(
        fl.decrypt_global_counts(owner, running, 4).tolist()
        == (mine + others).tolist(),
        "ring sum",
    )
    expected = (mine + others + [3, 0, 0, -40]).tolist()
    _require(fl.decrypt_global_counts(owner, updated, 4).tolist() == expected, "update")
    plain = float(mine @ gd / np.linalg.norm(mine) / np.linalg.norm(gd))
    _require(abs(fl.decrypt_similarity(owner, reply) - plain) < 1e-4, "cosine")
    hop = RingHop(
        federation="bench",
        round=0,
        sender="dev-a",
        ring_id="ring",
        hop_index=0,
        recipient="dev-b",
        contributors=("dev-a",),
        box=box,
    )

    def reseal() -> bytes:
        inner = open_sealed(b, a.public(), seal_context, box)
        return seal(b, a.public(), seal_context, inner)

    return {
        "ckks_public_context_bytes": len(public),
        "ckks_ciphertext_bytes": len(first),
        "ring_hop_message_bytes": len(encode(hop)),
        "device_load_context_ms": median_ms(
            lambda: CkksPublicContext.from_bytes(public), repeats
        ),
        "device_encrypt_counts_ms": median_ms(
            lambda: dev.encrypt_counts(ctx, others), repeats
        ),
        "device_ring_add_ms": median_ms(
            lambda: dev.add_counts(ctx, first, mine), repeats
        ),
        "device_ring_open_and_seal_ms": median_ms(reseal, repeats),
        "device_masked_cosine_ms": median_ms(
            lambda: dev.similarity_reply(ctx, unit, mine, rng), repeats
        ),
        "device_count_update_ms": median_ms(
            lambda: ctx.encrypt(np.array([3.0, 0.0, 0.0, -40.0])), repeats
        ),
        "coordinator_keygen_ms": keygen_ms,
        "coordinator_encrypt_unit_ms": median_ms(
            lambda: fl.encrypt_normalised_global(ctx, gd), repeats
        ),
        "coordinator_decrypt_gd_ms": median_ms(
            lambda: fl.decrypt_global_counts(owner, running, 4), repeats
        ),
        "coordinator_decrypt_cosine_ms": median_ms(
            lambda: fl.decrypt_similarity(owner, reply), repeats
        ),
        "coordinator_apply_update_ms": median_ms(
            lambda: fl.decrypt_global_counts(owner, ctx.add(running, delta), 4),
            repeats,
        ),
    }


def _protocol_figures() -> dict[str, float | int]:
    counts = {f"dev-{i + 1}": row for i, row in enumerate(get_table(TABLE))}
    with build_fleet(counts, seed=0) as fleet:  # the production FlickerMethod
        start = time.perf_counter()
        outcome = fleet.run()
        elapsed = time.perf_counter() - start
        stats = [t.stats for t in fleet.transports.values()]
        coordinator = fleet.coordinator_transport.stats
    state = outcome.state
    if state is None:
        raise RuntimeError(f"bench flicker: the run failed: {outcome.failure}")
    sent = [s.bytes_sent for s in stats]
    received = [s.bytes_received for s in stats]
    return {
        "protocol_devices": len(counts),
        "protocol_run_s": elapsed,
        "protocol_updates": state.updates,
        "protocol_localisations": state.localisations,
        "protocol_gi_after": state.gi,
        "device_bytes_sent_mean": float(np.mean(sent)),
        "device_bytes_sent_max": max(sent),
        "device_bytes_received_mean": float(np.mean(received)),
        "device_bytes_received_max": max(received),
        "device_messages_sent_max": max(s.messages_sent for s in stats),
        "coordinator_bytes_sent": coordinator.bytes_sent,
        "coordinator_bytes_received": coordinator.bytes_received,
    }


def run(*, as_json: bool, repeats: int = 15) -> int:
    """Measure, print, and return 1 if the public-context budget is missed."""
    figures = _step_figures(repeats)
    figures.update(_protocol_figures())
    return report(
        f"FLICKER (CKKS N=8192, table {TABLE}, 4 classes)",
        figures,
        BUDGETS,
        as_json=as_json,
    )
