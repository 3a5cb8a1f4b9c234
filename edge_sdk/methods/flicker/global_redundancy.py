"""FLICKER's global redundancy test on the wire (FLICKER §3.2.2): packing and crypto.

The dominant device asks whether each candidate of its local test (unit
feature vector ``b``, class ``L``) looks like at least ``chi`` of the other
devices' class-``L`` vectors (cosine > ``eta``). The coordinator holds the
CKKS key, so the exchange is built so that it only ever decrypts signs it
cannot interpret:

1. **Dominant** (`plan_layout`, `encrypt_candidates`): packs its candidates,
   padded to a power of two ``b'`` by repeating them, into at most
   `MAX_REDUNDANCY_CIPHERTEXTS` ciphertexts: ``per_ciphertext`` candidates
   per ciphertext, each repeated ``repeats`` times in blocks of ``block``
   slots. It seals the ciphertexts with ``L`` and ``eta`` to each peer (the
   coordinator relays the boxes, never sees ``Enc(b)``).
2. **Peer** (`arrange_vectors`, `signed_products`): pads its ``N`` class-``L``
   unit vectors to ``vector_slots`` (set by the coordinator from ``max(GD)``,
   so the same for every peer) with repeats of its own vectors, in a fresh
   random order per candidate. Block ``(k, t)`` of a product ciphertext
   decrypts (summed over the block; a zero-sum mask hides single slots) to
   ``s * sigma * (<b_k, v_t> - eta)`` with a secret random scale
   ``s = 2^u``, ``u ~ U[0, REDUNDANCY_SCALE_BITS)``, and a sign
   ``sigma = ±1`` from a seed only the peer and the dominant device know. It
   seals ``N`` and the seed to the dominant device.
3. **Coordinator** (`ursa.coordinator.methods.flicker.redundancy`): decrypts the block
   sums and forwards one bit per block, ``sum > 0``, with the peer's box.
4. **Dominant** (`count_above`, `decide`): un-flips the bits with the seed,
   counts per candidate the bits of the first ``N`` (real) slots of each
   peer, and removes a candidate if ``sum(above) / sum(N) >= chi`` over the
   peers that answered
   (`ursa.edge_sdk.methods.flicker.resampling.is_globally_redundant` on
   the same cosines gives the same answer, up to CKKS error ~1e-7 on the
   cosine next to ``eta``).

What each party learns:

* coordinator: that device D under-samples at this step, its peers, ``b'``
  (a power-of-two bucket of ``theta`` times D's majority count) and which
  peers answered in time. Per block a value whose sign is a fair coin flip
  and whose magnitude is ``|cos - eta|`` times an unknown factor in
  ``[1, 2^20)``: statistical blinding, not encryption (a magnitude above
  ``2^20 * (1 - eta)`` does show that this cosine is below ``eta``). No
  peer's count: every reply has the same size. After the step, as before,
  D's count change.
* peer: that D under-samples class ``L`` with threshold ``eta``, ``b'``, and
  ``vector_slots`` (a power-of-two bucket of the largest global class count,
  unless capped). The candidates are ciphertexts under the coordinator's key.
* dominant device: per answering peer, its class-``L`` count ``N`` and, per
  candidate, how many of that peer's class-``L`` vectors have cosine above
  ``eta`` (not which: a fresh order per candidate). The paper gives it every
  cosine.
* Collusion: the coordinator and a peer together can decrypt D's candidate
  vectors; the coordinator and D together get the above/below bit of every
  (candidate, shuffled vector) pair. Both are inherent in the coordinator
  holding the key (as a coordinator and a ring neighbour see a partial sum).
* Not covered (honest-but-curious model): a peer can return wrong products
  within range or a false ``N``; a dominant device can send chosen vectors
  as candidates and learn how many of a peer's vectors lie near them.

Bounds: candidates beyond ``MAX_REDUNDANCY_CIPHERTEXTS * copies`` (2,048 at 4
features, 512 at 10) are not tested and stay; a peer with more than
``vector_slots`` vectors uses a uniform sample of them (an estimate of the
share; the coordinator caps ``vector_slots`` to bound a reply's ciphertexts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ursa.crypto.ckks import pad_length, zero_sum_mask
from ursa.edge_sdk.methods.flicker.algorithm import ResamplingError
from ursa.protocol.messages import MAX_REDUNDANCY_CIPHERTEXTS, REDUNDANCY_SCALE_BITS

if TYPE_CHECKING:
    from ursa.crypto.ckks import CkksPublicContext

__all__ = [
    "MAX_REDUNDANCY_CIPHERTEXTS",
    "REDUNDANCY_SCALE_BITS",
    "SEED_BYTES",
    "Layout",
    "arrange_vectors",
    "count_above",
    "decide",
    "encrypt_candidates",
    "flip_bits",
    "plan_layout",
    "signed_products",
]

SEED_BYTES = 32
_FLIP_LABEL = b"ursa-flicker-redundancy-flip-v1"

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Layout:
    """How candidates fill ciphertexts: ciphertexts x per_ciphertext x repeats.

    Attributes:
        block: slots per feature vector (a power of two).
        copies: blocks per ciphertext (``slot_count // block``).
        per_ciphertext: candidates per ciphertext.
        ciphertexts: candidate ciphertexts.
    """

    block: int
    copies: int
    per_ciphertext: int
    ciphertexts: int

    @classmethod
    def of(
        cls, block: int, per_ciphertext: int, ciphertexts: int, slot_count: int
    ) -> Layout:
        """Check a received layout against the context's ``slot_count``.

        Raises:
            ResamplingError: sizes that are not powers of two or do not fit.
        """
        sizes = (block, per_ciphertext, slot_count)
        if any(v < 1 or v & (v - 1) for v in sizes) or block > slot_count:
            raise ResamplingError(f"bad layout {block}/{per_ciphertext}/{slot_count}")
        copies = slot_count // block
        if per_ciphertext > copies:
            raise ResamplingError(f"{per_ciphertext} candidates exceed {copies} blocks")
        if not 1 <= ciphertexts <= MAX_REDUNDANCY_CIPHERTEXTS:
            raise ResamplingError(f"{ciphertexts} candidate ciphertexts")
        return cls(block, copies, per_ciphertext, ciphertexts)

    @property
    def repeats(self) -> int:
        """Blocks (peer vectors) per candidate in one ciphertext."""
        return self.copies // self.per_ciphertext

    @property
    def candidates(self) -> int:
        """Candidate places, ``b'`` (real candidates are repeated to fill them)."""
        return self.per_ciphertext * self.ciphertexts

    def parts(self, vector_slots: int) -> int:
        """Product ciphertexts in one peer's reply.

        Raises:
            ResamplingError: ``vector_slots`` is not a multiple of `repeats`.
        """
        if vector_slots < self.repeats or vector_slots % self.repeats:
            raise ResamplingError(
                f"vector_slots {vector_slots} is not a multiple of {self.repeats}"
            )
        return self.ciphertexts * vector_slots // self.repeats


def plan_layout(num_candidates: int, num_features: int, slot_count: int) -> Layout:
    """Dominant device: the layout for ``num_candidates`` (the first ones fit)."""
    block = pad_length(num_features)
    if block > slot_count:
        raise ResamplingError(f"{num_features} features exceed {slot_count} slots")
    copies = slot_count // block
    tested = min(max(1, num_candidates), MAX_REDUNDANCY_CIPHERTEXTS * copies)
    padded = pad_length(tested)
    per_ciphertext = min(padded, copies)
    return Layout(block, copies, per_ciphertext, padded // per_ciphertext)


def encrypt_candidates(
    context: CkksPublicContext, unit: FloatArray, layout: Layout
) -> list[bytes]:
    """Dominant device: ``Enc`` of the candidates, each repeated `Layout.repeats` times.

    Candidate place ``k`` holds row ``k % tested`` (the first ``tested`` rows).
    """
    if unit.ndim != 2 or not len(unit) or pad_length(unit.shape[1]) != layout.block:
        raise ResamplingError(f"candidates of shape {unit.shape} do not fit the layout")
    tested = min(len(unit), layout.candidates)
    rows = unit[np.arange(layout.candidates) % tested]
    padded = np.pad(rows, ((0, 0), (0, layout.block - unit.shape[1])))
    repeated = np.repeat(padded, layout.repeats, axis=0)
    return [
        context.encrypt(chunk.reshape(-1))
        for chunk in np.split(repeated, layout.ciphertexts)
    ]


def arrange_vectors(
    vectors: FloatArray, vector_slots: int, candidates: int, rng: np.random.Generator
) -> tuple[FloatArray, IndexArray, int]:
    """Peer: the vectors (``pool``), per candidate an order of ``vector_slots`` of them.

    Returns ``(pool, order, real)``: ``order[k, t]`` indexes ``pool``; the
    first ``real`` slots of each row are the peer's vectors in a fresh random
    order, the rest repeats of random ones (fresh random unit vectors when the
    peer has none, ``real = 0``). More than ``vector_slots`` vectors: a
    uniform sample of them.
    """
    if vectors.ndim != 2:
        raise ResamplingError(f"feature vectors of shape {vectors.shape}")
    real = min(len(vectors), vector_slots)
    if real == 0:
        pool = np.abs(rng.normal(size=(vector_slots, max(1, vectors.shape[1]))))
        pool /= np.linalg.norm(pool, axis=1, keepdims=True)
        return pool, np.tile(np.arange(vector_slots), (candidates, 1)), 0
    pool = vectors[rng.permutation(len(vectors))[:real]]
    order = np.empty((candidates, vector_slots), dtype=np.int64)
    for k in range(candidates):
        order[k, :real] = rng.permutation(real)
        order[k, real:] = rng.integers(0, real, size=vector_slots - real)
    return pool, order, real


def flip_bits(seed: bytes, count: int) -> BoolArray:
    """``count`` pseudo-random bits from a peer's seed (SHAKE-256)."""
    if len(seed) != SEED_BYTES:
        raise ResamplingError(f"a seed has {SEED_BYTES} bytes, got {len(seed)}")
    stream = hashlib.shake_256(_FLIP_LABEL + seed).digest((count + 7) // 8)
    bits: BoolArray = np.unpackbits(np.frombuffer(stream, np.uint8))[:count] == 1
    return bits


def _part_grid(
    bits: npt.NDArray[np.generic], layout: Layout, vector_slots: int
) -> npt.NDArray[np.generic]:
    """Reply order (ciphertext, part, candidate, repeat) -> (candidate place, slot)."""
    grid = bits.reshape(
        layout.ciphertexts,
        vector_slots // layout.repeats,
        layout.per_ciphertext,
        layout.repeats,
    )
    placed: npt.NDArray[np.generic] = grid.transpose(0, 2, 1, 3).reshape(
        layout.candidates, vector_slots
    )
    return placed


def signed_products(
    context: CkksPublicContext,
    candidate_ciphertexts: Sequence[bytes],
    layout: Layout,
    pool: FloatArray,
    order: IndexArray,
    eta: float,
    seed: bytes,
    rng: np.random.Generator,
) -> Iterator[bytes]:
    """Peer: the reply's product ciphertexts, in part order (see the module doc).

    Block ``(k, t)`` sums to ``s * sigma * (<b_k, pool[order[k, t]]> - eta)``.
    """
    vector_slots = order.shape[1]
    parts = layout.parts(vector_slots)
    if (
        len(candidate_ciphertexts) != layout.ciphertexts
        or order.shape[0] != layout.candidates
    ):
        raise ResamplingError("reply does not match the layout")
    features = pool.shape[1]
    if features > layout.block:
        raise ResamplingError(f"{features} features exceed {layout.block} slots")
    flips = flip_bits(seed, parts * layout.copies)
    sigma = np.where(_part_grid(flips, layout, vector_slots), -1.0, 1.0)
    per_part = parts // layout.ciphertexts
    g, r = layout.per_ciphertext, layout.repeats
    for a, ciphertext in enumerate(candidate_ciphertexts):
        for q in range(per_part):
            rows = slice(a * g, (a + 1) * g)
            cols = slice(q * r, (q + 1) * r)
            scale = 2.0 ** rng.uniform(0.0, REDUNDANCY_SCALE_BITS, size=(g, r))
            coef = scale * sigma[rows, cols]
            plain = np.zeros((g, r, layout.block))
            plain[:, :, :features] = pool[order[rows, cols]] * coef[:, :, None]
            mask = np.stack([zero_sum_mask(layout.block, rng) for _ in range(g * r)])
            mask[:, 0] -= (coef * eta).reshape(-1)
            product = context.multiply_plain(ciphertext, plain.reshape(-1))
            yield context.add(product, context.encrypt(mask.reshape(-1)))


def count_above(
    signs: bytes, seed: bytes, layout: Layout, vector_slots: int, real: int
) -> IndexArray:
    """Dominant device: per candidate place, how many of a peer's ``real`` vectors pass.

    ``signs`` holds one bit per block (``sum > 0``, `np.packbits` order) over
    the peer's whole reply.

    Raises:
        ResamplingError: ``signs`` has the wrong length or ``real`` is out of range.
    """
    count = layout.parts(vector_slots) * layout.copies
    if len(signs) != (count + 7) // 8 or not 0 <= real <= vector_slots:
        raise ResamplingError(f"{len(signs)} sign bytes / {real} vectors do not fit")
    bits = np.unpackbits(np.frombuffer(signs, np.uint8))[:count] == 1
    above = _part_grid(bits ^ flip_bits(seed, count), layout, vector_slots)
    totals: IndexArray = above[:, :real].sum(axis=1).astype(np.int64)
    return totals


def decide(
    above: IndexArray, vectors: int, num_candidates: int, chi: float
) -> BoolArray:
    """Flags of the real candidates: at least ``chi`` of all ``vectors`` pass.

    Candidates past the tested places stay (False); no vectors: nothing is
    redundant (as `ursa.edge_sdk.methods.flicker.resampling.is_globally_redundant`).
    """
    flags = np.zeros(num_candidates, dtype=bool)
    if vectors == 0:
        return flags
    tested = min(num_candidates, len(above))
    flags[:tested] = above[:tested] / vectors >= chi
    return flags
