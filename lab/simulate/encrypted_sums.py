"""Dubhe's two sums through real packed Paillier, with crypto time and bytes.

`EncryptedSums` is a `SumBackend` for the selection simulator that plays every
party's crypto step in-process, with one key pair per run (the key epoch the
agent generates and seals to the devices):

* **Registration.** Each device packs its one-hot registry
  (`PackingLayout(1, N)`), encrypts it and sends the bytes; the coordinator
  parses them with ``num_parties=1`` pinned and the codebook length checked,
  and sums the ciphertexts. The sum travels back as bytes (parsed with
  ``num_parties=N`` pinned); a device decrypts it and checks that it sums to
  the number of registrants (`RegistrySumError` otherwise). Every device
  decrypts the same sum, so the simulator decrypts it once and counts it once
  ("per device").
* **Tries.** Each tentative member of a round encrypts its fixed-point
  distribution once (`PackingLayout(DISTRIBUTION_SCALE, K)`, the simulator's
  non-negative integers, so sums are bit-identical to the plaintext path); the
  coordinator parses it (``num_parties=1``) and adds it into every try of the
  round it is in; the agent parses each try sum (``num_parties=K``) and
  decrypts it. The real device encodes with `FixedPoint(1.0)` at 24 bits; the
  simulator keeps its 2**20 integers so that both paths choose the same sets.

Timings are wall-clock seconds of this process, split by party: device
encryption (including the ``r**n`` a device could precompute in idle time),
coordinator parsing and adding, device or agent decryption. Bytes are what
crosses the broker: each upload, each registry sum once per registrant, each
try sum to the agent.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ursa.crypto.encoding import PackingLayout
from ursa.crypto.paillier import (
    DEFAULT_KEY_BITS,
    EncryptedVector,
    PaillierPublicKey,
    PaillierSecretKey,
    decrypt_vector,
    encrypt_vector,
    encrypted_vector_from,
    generate_keypair,
    sum_encrypted,
)
from ursa.lab.simulate.selection import SelectionSimConfig, simulate_selection
from ursa.lab.simulate.selection_sums import DISTRIBUTION_SCALE, SumBackend

ENCRYPTED_MAX_CLIENTS = 2000
"""Largest N an encrypted simulation accepts without ``force``."""


class RegistrySumError(ValueError):
    """A decrypted overall registry does not sum to the number of registrants."""


@dataclass
class PhaseStats:
    """Crypto work and traffic of one stage of a simulation."""

    registry_sums: int = 0
    registry_encryptions: int = 0
    registry_bytes_up: int = 0
    registry_bytes_down: int = 0
    registry_decryptions_per_device: int = 0
    rounds: int = 0
    distribution_encryptions: int = 0
    distribution_bytes_up: int = 0
    try_sums: int = 0
    try_sum_bytes: int = 0
    device_encrypt_s: float = 0.0
    coordinator_parse_s: float = 0.0
    coordinator_sum_s: float = 0.0
    decrypt_s: float = 0.0

    def crypto_s(self) -> float:
        """Every timed crypto step of the stage, in seconds."""
        return (
            self.device_encrypt_s
            + self.coordinator_parse_s
            + self.coordinator_sum_s
            + self.decrypt_s
        )

    def total_bytes(self) -> int:
        """Every ciphertext byte of the stage that crosses the broker."""
        return (
            self.registry_bytes_up
            + self.registry_bytes_down
            + self.distribution_bytes_up
            + self.try_sum_bytes
        )


class EncryptedSums:
    """Registry and per-try sums through packed Paillier; see the module docstring."""

    def __init__(
        self,
        key_bits: int = DEFAULT_KEY_BITS,
        *,
        keypair: tuple[PaillierPublicKey, PaillierSecretKey] | None = None,
        distribution_max: int = DISTRIBUTION_SCALE,
    ) -> None:
        """Generate the run's key pair (or adopt ``keypair``, e.g. in tests)."""
        start = time.perf_counter()
        self.public_key, self.secret_key = keypair or generate_keypair(key_bits)
        self.keygen_s = time.perf_counter() - start if keypair is None else 0.0
        self.key_bits = self.public_key.key_bits
        self.distribution_max = distribution_max
        self.registry_ciphertext_bytes = 0
        self.distribution_ciphertext_bytes = 0
        self.phases: dict[str, PhaseStats] = {}
        self._phase = "run"

    def backend(self) -> SumBackend:
        """This object as the simulator's sum hook."""
        return SumBackend(self.registry_sum, self.try_sums, self.set_phase)

    def set_phase(self, name: str) -> None:
        """Account the following sums to stage ``name``."""
        self._phase = name

    def _stats(self) -> PhaseStats:
        return self.phases.setdefault(self._phase, PhaseStats())

    def registry_sum(
        self, indices: NDArray[np.int64], length: int
    ) -> NDArray[np.int64]:
        """Encrypt every device's one-hot registry, sum, decrypt and check.

        Raises:
            ValueError: a slot index outside ``[0, length)``.
            RegistrySumError: the decrypted registry does not sum to N.
        """
        slots = np.asarray(indices, dtype=np.int64)
        n = int(slots.size)
        if n == 0 or slots.min() < 0 or slots.max() >= length:
            raise ValueError(f"registry slots must lie in [0, {length}), N >= 1")
        stats, pk = self._stats(), self.public_key
        layout = PackingLayout(1, n, self.key_bits)
        received: list[EncryptedVector] = []
        for slot in slots.tolist():
            start = time.perf_counter()
            one_hot = [0] * length
            one_hot[slot] = 1
            blob = encrypt_vector(pk, layout, one_hot).to_bytes(pk)
            parse = time.perf_counter()
            vector = encrypted_vector_from(blob, pk, num_parties=1)
            if vector.length != length:
                raise ValueError(f"registry of {vector.length} slots, not {length}")
            received.append(vector)
            stats.coordinator_parse_s += time.perf_counter() - parse
            stats.device_encrypt_s += parse - start
            stats.registry_bytes_up += len(blob)
            self.registry_ciphertext_bytes = len(blob)
        start = time.perf_counter()
        total = sum_encrypted(pk, received).to_bytes(pk)
        decrypt = time.perf_counter()
        stats.coordinator_sum_s += decrypt - start
        registry = decrypt_vector(
            self.secret_key, layout, encrypted_vector_from(total, pk, num_parties=n)
        )
        stats.decrypt_s += time.perf_counter() - decrypt
        if sum(registry) != n:
            raise RegistrySumError(
                f"decrypted registry sums to {sum(registry)}, not {n} registrants"
            )
        stats.registry_sums += 1
        stats.registry_encryptions += n
        stats.registry_bytes_down += len(total) * n
        stats.registry_decryptions_per_device += 1
        return np.asarray(registry, dtype=np.int64)

    def try_sums(
        self, fixed: NDArray[np.int64], sets: NDArray[np.int64]
    ) -> NDArray[np.int64]:
        """R x H x C decrypted per-try sums of the members' fixed-point distributions.

        Raises:
            ValueError: ``sets`` is not R x H x K, or a try repeats a device.
            EncodingError: a distribution entry outside ``[0, distribution_max]``.
        """
        tries = np.asarray(sets, dtype=np.int64)
        if tries.ndim != 3:
            raise ValueError(f"sets must be rounds x tries x K, got {tries.shape}")
        rounds, h, k = tries.shape
        c = fixed.shape[1]
        stats, pk = self._stats(), self.public_key
        layout = PackingLayout(self.distribution_max, k, self.key_bits)
        out = np.empty((rounds, h, c), dtype=np.int64)
        for r in range(rounds):
            received: dict[int, EncryptedVector] = {}
            for member in np.unique(tries[r]).tolist():
                start = time.perf_counter()
                blob = encrypt_vector(pk, layout, fixed[member].tolist()).to_bytes(pk)
                parse = time.perf_counter()
                received[member] = encrypted_vector_from(blob, pk, num_parties=1)
                stats.coordinator_parse_s += time.perf_counter() - parse
                stats.device_encrypt_s += parse - start
                stats.distribution_bytes_up += len(blob)
                self.distribution_ciphertext_bytes = len(blob)
            stats.distribution_encryptions += len(received)
            for j in range(h):
                members = tries[r, j].tolist()
                if len(set(members)) != k:
                    raise ValueError(f"round {r} try {j} repeats a device")
                start = time.perf_counter()
                total = sum_encrypted(pk, (received[m] for m in members)).to_bytes(pk)
                decrypt = time.perf_counter()
                vector = encrypted_vector_from(total, pk, num_parties=k)
                out[r, j] = decrypt_vector(self.secret_key, layout, vector)
                stats.decrypt_s += time.perf_counter() - decrypt
                stats.coordinator_sum_s += decrypt - start
                stats.try_sum_bytes += len(total)
            stats.try_sums += h
            stats.rounds += 1
        return out

    def report(self) -> dict[str, Any]:
        """JSON-ready crypto time and bytes, per stage and in total."""
        phases = {
            name: {
                **asdict(stats),
                "crypto_s": stats.crypto_s(),
                "total_bytes": stats.total_bytes(),
            }
            for name, stats in self.phases.items()
        }
        return {
            "key_bits": self.key_bits,
            "keygen_s": self.keygen_s,
            "registry_ciphertext_bytes": self.registry_ciphertext_bytes,
            "distribution_ciphertext_bytes": self.distribution_ciphertext_bytes,
            "phases": phases,
            "crypto_s": sum(s.crypto_s() for s in self.phases.values()),
            "total_bytes": sum(s.total_bytes() for s in self.phases.values()),
        }


def check_encrypted_size(num_clients: int, *, force: bool = False) -> None:
    """Refuse an encrypted run above `ENCRYPTED_MAX_CLIENTS` unless forced.

    Raises:
        ValueError: ``num_clients`` is too large and ``force`` is False.
    """
    if num_clients > ENCRYPTED_MAX_CLIENTS and not force:
        raise ValueError(
            f"--encrypted with N={num_clients} > {ENCRYPTED_MAX_CLIENTS}: every "
            "registration and every round's members cost one Paillier encryption "
            "each (~8 ms at 2048 bits); pass --force to run it anyway"
        )


def simulate_encrypted(
    config: SelectionSimConfig,
    key_bits: int = DEFAULT_KEY_BITS,
    *,
    force: bool = False,
    keypair: tuple[PaillierPublicKey, PaillierSecretKey] | None = None,
    keep_selections: bool = False,
) -> dict[str, Any]:
    """`simulate_selection` through `EncryptedSums`, with a "crypto" section.

    Raises:
        ValueError: N above `ENCRYPTED_MAX_CLIENTS` without ``force``, or a bad
            config.
    """
    check_encrypted_size(config.num_clients, force=force)
    sums = EncryptedSums(key_bits, keypair=keypair)
    report = simulate_selection(config, sums.backend(), keep_selections=keep_selections)
    report["crypto"] = sums.report()
    return report
