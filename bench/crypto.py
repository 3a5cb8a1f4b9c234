"""`ursa bench crypto`: packed Paillier registries and CKKS figures, with budgets.

Both ways of encrypting a registry are measured in the same run: the packed one
ursa uses (one ciphertext for the 56 slots) and the paper's (one phe ciphertext
per slot), so the speed-up is a ratio, not a comparison with another machine.
"""

from __future__ import annotations

import time

import numpy as np
import phe

from ursa.bench.common import Budget, median_ms, report
from ursa.crypto.encoding import PackingLayout
from ursa.crypto.obfuscators import ObfuscatorPool
from ursa.crypto.paillier import (
    decrypt_vector,
    encrypt_vector,
    encrypted_vector_from,
    generate_keypair,
    sum_encrypted,
)

KEY_BITS = 2048
REGISTRY_SLOTS = 56  # C=10, G={1,2,10}: 10 + 45 + 1
MAX_PARTIES = 100_000
AGGREGATE_COUNT = 100_000

BUDGETS = [
    Budget("registry_encrypt_ms", at_most=15.0),
    Budget("registry_encrypt_speedup", at_least=40.0),
    Budget("registry_bytes", at_most=600),
    Budget("aggregate_registries_per_s", at_least=100_000),
    Budget("online_encrypt_ms", at_most=0.1),
    Budget("ckks_public_context_bytes", at_most=500_000),
    Budget("ckks_dot_abs_error", at_most=1e-4),
]


def _require(condition: bool, message: str) -> None:
    """Fail the benchmark loudly when a measured path gives a wrong result."""
    if not condition:
        raise RuntimeError(f"bench crypto: {message}")


def _paillier_figures(repeats: int) -> dict[str, float | int]:
    public, secret = generate_keypair(KEY_BITS)
    layout = PackingLayout(max_value=1, max_parties=MAX_PARTIES, key_bits=KEY_BITS)
    registry = [0] * REGISTRY_SLOTS
    registry[17] = 1

    packed_ms = median_ms(lambda: encrypt_vector(public, layout, registry), repeats)
    phe_key = phe.PaillierPublicKey(public.n)  # the paper's way: phe, one per slot
    per_slot_ms = median_ms(
        lambda: [phe_key.encrypt(v) for v in registry], max(3, repeats // 5)
    )
    encrypted = encrypt_vector(public, layout, registry)
    wire = encrypted.to_bytes(public)
    decrypt_ms = median_ms(lambda: decrypt_vector(secret, layout, encrypted), repeats)
    _require(
        decrypt_vector(secret, layout, encrypted_vector_from(wire, public)) == registry,
        "registry did not survive a bytes round-trip",
    )

    per_slot_bytes = REGISTRY_SLOTS * public.ciphertext_size()

    with ObfuscatorPool(public, capacity=repeats + 2, background=False) as pool:
        pool.fill()
        online_ms = median_ms(
            lambda: encrypt_vector(public, layout, registry, obfuscators=pool),
            repeats,
            warmup=0,
        )

    # Homomorphic adds of packed registries: the coordinator's registration sum.
    distinct = [encrypt_vector(public, layout, registry) for _ in range(8)]
    stream = (distinct[i % len(distinct)] for i in range(AGGREGATE_COUNT))
    start = time.perf_counter()
    total = sum_encrypted(public, stream)
    aggregate_s = time.perf_counter() - start
    summed = decrypt_vector(secret, layout, total)
    _require(
        summed[17] == AGGREGATE_COUNT and sum(summed) == AGGREGATE_COUNT,
        "the aggregated registry does not match the plaintext sum",
    )

    return {
        "key_bits": KEY_BITS,
        "registry_slots": REGISTRY_SLOTS,
        "registry_encrypt_ms": packed_ms,
        "registry_encrypt_per_slot_ms": per_slot_ms,
        "registry_encrypt_speedup": per_slot_ms / packed_ms,
        "registry_decrypt_ms": decrypt_ms,
        "registry_bytes": len(wire),
        "registry_bytes_per_slot_way": per_slot_bytes,
        "aggregate_registries_per_s": AGGREGATE_COUNT / aggregate_s,
        "online_encrypt_ms": online_ms,
    }


def _ckks_figures(repeats: int) -> dict[str, float | int]:
    from ursa.crypto.ckks import CkksKeyOwner, CkksPublicContext, unit_vector

    owner = CkksKeyOwner()
    context_bytes = owner.public_context_bytes()
    device = CkksPublicContext.from_bytes(context_bytes)
    rng = np.random.default_rng(0)
    x = unit_vector(rng.random(10))
    y = unit_vector(rng.random(10))
    encrypt_ms = median_ms(lambda: device.encrypt(x), repeats)
    ciphertext = device.encrypt(x)
    dot_ms = median_ms(lambda: device.masked_product(ciphertext, y, rng), repeats)
    errors = []
    for _ in range(max(3, repeats)):
        a = unit_vector(rng.standard_normal(10))
        b = unit_vector(rng.standard_normal(10))
        got = owner.decrypt_sum(device.masked_product(device.encrypt(a), b, rng))
        errors.append(abs(got - float(a @ b)))
    return {
        "ckks_public_context_bytes": len(context_bytes),
        "ckks_encrypt_ms": encrypt_ms,
        "ckks_masked_dot_ms": dot_ms,
        "ckks_dot_abs_error": max(errors),
    }


def run(*, as_json: bool, repeats: int = 15) -> int:
    """Measure, print, and return 1 if a budget is missed."""
    figures: dict[str, float | int] = {}
    figures.update(_paillier_figures(repeats))
    figures.update(_ckks_figures(repeats))
    return report("ursa bench crypto", figures, BUDGETS, as_json=as_json)
