"""The global redundancy test's packing and crypto against plaintext cosines."""

from __future__ import annotations

import numpy as np
import pytest

from ursa.coordinator.methods.flicker.redundancy import MAX_MAGNITUDE, decrypt_signs
from ursa.crypto.ckks import CkksKeyOwner
from ursa.edge_sdk.methods.flicker import global_redundancy as gr
from ursa.edge_sdk.methods.flicker.algorithm import ResamplingError
from ursa.edge_sdk.methods.flicker.resampling import is_globally_redundant, unit_rows

pytest.importorskip("tenseal")

OWNER = CkksKeyOwner()
CTX = OWNER.public_context()
SLOTS = CTX.slot_count
ETA = 0.95


def _unit(rng: np.random.Generator, n: int, k: int, spread: float) -> np.ndarray:
    """Non-negative unit rows near one direction (``spread`` sets the cosines)."""
    base = np.linspace(1.0, 2.0, k)
    return unit_rows(np.abs(base + spread * rng.normal(size=(n, k))))


def _run(candidates: np.ndarray, peers: list[np.ndarray], vector_slots: int, seed: int):
    """Dominant + peers + key owner in one place; returns flags and above-counts."""
    rng = np.random.default_rng(seed)
    layout = gr.plan_layout(len(candidates), candidates.shape[1], SLOTS)
    cts = gr.encrypt_candidates(CTX, candidates, layout)
    vector_slots = max(vector_slots, layout.repeats)  # as the coordinator picks
    above = np.zeros(layout.candidates, dtype=np.int64)
    vectors = 0
    for vecs in peers:
        pool, order, real = gr.arrange_vectors(
            vecs, vector_slots, layout.candidates, rng
        )
        seed_bytes = rng.bytes(gr.SEED_BYTES)
        bits = [
            decrypt_signs(OWNER, ct, layout.block, layout.copies)
            for ct in gr.signed_products(
                CTX, cts, layout, pool, order, ETA, seed_bytes, rng
            )
        ]
        assert len(bits) == layout.parts(vector_slots)
        signs = np.packbits(np.concatenate(bits)).tobytes()
        above += gr.count_above(signs, seed_bytes, layout, vector_slots, real)
        vectors += real
    return gr.decide(above, vectors, len(candidates), 0.5), above[: len(candidates)]


@pytest.mark.parametrize(("num_candidates", "features"), [(5, 4), (3, 10)])
def test_signed_products_give_the_plaintext_counts_and_flags(
    num_candidates: int, features: int
) -> None:
    rng = np.random.default_rng(1)
    candidates = _unit(rng, num_candidates, features, 0.5)
    peers = [_unit(rng, 7, features, 0.5), _unit(rng, 0, features, 0.5)]
    peers.append(_unit(rng, 12, features, 0.5))

    flags, above = _run(candidates, peers, vector_slots=64, seed=2)

    sims = candidates @ np.concatenate(peers).T
    assert np.all(np.abs(sims - ETA) > 1e-4)  # no cosine sits on the threshold
    assert above.tolist() == (sims > ETA).sum(axis=1).tolist()
    expected = [is_globally_redundant(row, eta=ETA, chi=0.5) for row in sims]
    assert flags.tolist() == expected
    assert 0 < sum(expected) < num_candidates  # the case can fail both ways


def test_a_peer_with_more_vectors_than_slots_contributes_a_sample() -> None:
    rng = np.random.default_rng(3)
    candidates = _unit(rng, 2, 4, 0.01)  # all cosines ~1: every vector passes
    flags, above = _run(candidates, [_unit(rng, 600, 4, 0.01)], 512, seed=4)

    assert above.tolist() == [512, 512] and flags.all()


def test_the_coordinator_sees_coin_flips_not_the_outcome() -> None:
    rng = np.random.default_rng(5)
    candidates = _unit(rng, 1, 4, 0.01)
    vecs = _unit(rng, 200, 4, 0.01)  # every true bit is 1 (cosine > eta)
    layout = gr.plan_layout(1, 4, SLOTS)
    pool, order, _ = gr.arrange_vectors(vecs, 1024, layout.candidates, rng)
    (ct,) = gr.encrypt_candidates(CTX, candidates, layout)
    seed = rng.bytes(gr.SEED_BYTES)
    (product,) = gr.signed_products(CTX, [ct], layout, pool, order, ETA, seed, rng)

    seen = decrypt_signs(OWNER, product, layout.block, layout.copies)
    values = OWNER.decrypt(product).reshape(layout.copies, layout.block).sum(axis=1)
    assert 0.4 < seen.mean() < 0.6  # a fair coin per block
    assert np.array_equal(seen ^ gr.flip_bits(seed, layout.copies), np.ones(1024, bool))
    assert np.abs(values).max() < MAX_MAGNITUDE and np.abs(values).max() > 1.0


def test_layouts_pack_candidates_in_powers_of_two_within_two_ciphertexts() -> None:
    small = gr.plan_layout(5, 4, SLOTS)
    many = gr.plan_layout(1500, 4, SLOTS)
    capped = gr.plan_layout(10_000, 10, SLOTS)

    assert (small.block, small.per_ciphertext, small.ciphertexts) == (4, 8, 1)
    assert small.repeats == 128 and small.parts(256) == 2
    assert (many.per_ciphertext, many.ciphertexts, many.repeats) == (1024, 2, 1)
    assert capped.candidates == 2 * SLOTS // 16  # the rest is not tested
    with pytest.raises(ResamplingError):
        small.parts(64)  # fewer vector slots than one ciphertext covers
    with pytest.raises(ResamplingError):
        gr.Layout.of(4, 2048, 1, SLOTS)  # more candidates than blocks
    with pytest.raises(ResamplingError):
        gr.Layout.of(3, 1, 1, SLOTS)
    assert gr.Layout.of(4, 8, 1, SLOTS) == small


def test_arranged_vectors_put_every_real_vector_first_in_a_fresh_order() -> None:
    rng = np.random.default_rng(6)
    vecs = _unit(rng, 5, 4, 0.5)
    pool, order, real = gr.arrange_vectors(vecs, 16, 3, rng)

    assert real == 5 and order.shape == (3, 16)
    for row in order:
        assert sorted(row[:5]) == list(range(5))  # each real vector once
    assert len({tuple(row[:5]) for row in order}) > 1  # orders differ per candidate
    assert {tuple(v) for v in pool} == {tuple(v) for v in vecs}
    empty_pool, _, none = gr.arrange_vectors(np.zeros((0, 0)), 16, 3, rng)
    assert none == 0 and np.allclose(np.linalg.norm(empty_pool, axis=1), 1.0)


def test_sign_bits_of_the_wrong_length_or_count_are_refused() -> None:
    layout = gr.plan_layout(4, 4, SLOTS)
    seed = bytes(gr.SEED_BYTES)
    signs = bytes(layout.parts(256) * layout.copies // 8)

    assert gr.count_above(signs, seed, layout, 256, 3).shape == (layout.candidates,)
    with pytest.raises(ResamplingError):
        gr.count_above(signs[:-1], seed, layout, 256, 3)
    with pytest.raises(ResamplingError):
        gr.count_above(signs, seed, layout, 256, 257)
    with pytest.raises(ResamplingError):
        gr.flip_bits(b"short", 8)


def test_decide_tests_only_the_tested_places_and_nothing_without_vectors() -> None:
    above = np.array([3, 2, 1])

    assert gr.decide(above, 4, 5, 0.5).tolist() == [True, True, False, False, False]
    assert not gr.decide(above, 0, 3, 0.5).any()
