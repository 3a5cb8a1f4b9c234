"""The simulated fleet of `ursa bench coordinator`: N devices' side, cheap per device.

It reacts to what the coordinator sends, as ursa's devices do, so it follows
the protocol whatever its shape: every `SealRequest` page is answered with a
sealed key per recipient in it; a device registers once it holds the epoch's
public key and its box; on a `RoundAnnounce` the devices draw their H coins
(eq. (6) from the decrypted registry) and those with a True draw volunteer,
or every registered device when the announce signs ``explicit_replies`` (a
fleet under the coordinator's ``[selection] explicit_replies_below``) or
the bench says ``all_volunteer``; a `TryAssignment` gets the device's
encrypted distribution; `TrySums` gets the agent's signed answer. Nothing
assumes one `SealRequest` or that every device volunteers.

What it reuses from ursa's device: identity keys, `seal`, Algorithm 1's
registry slot, eq. (6), the volunteer coin, the registry and distribution
encryptions, the agent's `best_try`, the derived message ids. What it shares:
device ``i`` holds the label distribution of pool entry ``i % pool``, and its
registry and distribution ciphertexts are that entry's, encrypted once per
key epoch. Paillier-encrypting 100,000 registries would take far longer than
the coordinator's work; the coordinator only checks and sums ciphertexts, so
reusing a few distinct ones changes nothing it does.

Identities are derived from ``seed`` and the device's index, so only the
public keys are kept; the agent's private keys are derived again when a key
epoch names it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from ursa.crypto.encoding import PackingLayout
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.paillier import (
    PaillierSecretKey,
    decrypt_real_sum,
    decrypt_vector,
    encrypt_reals,
    encrypt_vector,
    encrypted_vector_from,
    generate_keypair,
)
from ursa.crypto.sealing import seal
from ursa.edge_sdk.key_epoch import seal_context
from ursa.edge_sdk.methods.dubhe.draws import participation_probabilities
from ursa.edge_sdk.methods.dubhe.tries import best_try
from ursa.edge_sdk.registration import (
    DISTRIBUTION_CODEC,
    registry_indices,
    registry_vector,
)
from ursa.protocol.codebook import Codebook
from ursa.protocol.envelope import decode, encode, message_kind, signing_bytes
from ursa.protocol.errors import ProtocolError
from ursa.protocol.ids import derived_id
from ursa.protocol.messages import (
    AgentAnswer,
    AgentPublicKey,
    BaseMessage,
    EncryptedDistribution,
    EnrolResult,
    ErrorReply,
    Hello,
    KeyEpochStart,
    Registration,
    RegistryCheck,
    RegistrySum,
    RegistryVerdict,
    RoundAnnounce,
    SealedBox,
    SealedKeys,
    SealedSecretKey,
    SealRequest,
    SelectionResult,
    Status,
    TryAssignment,
    TrySums,
    Volunteer,
    split_boxes,
)
from ursa.protocol.topics import name_for, parse_topic, qos_for, status_topic, up_topic

__all__ = ["SimulatedFleet", "SimulatedPublish"]

_M = TypeVar("_M", bound=BaseMessage)


@dataclass(frozen=True)
class SimulatedPublish:
    """One message a simulated device publishes."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False
    burst: bool = False
    """The sender's next message goes out with this one (a Hello and its status)."""


@dataclass
class _Epoch:
    """The current key epoch as the fleet knows it (the agent's keys included)."""

    notice: KeyEpochStart
    agent: int
    slots: NDArray[np.int64]
    """Registry slot of each pool entry (Algorithm 1 under the notice's sigma)."""
    secret_key: PaillierSecretKey | None = None
    public_key_seen: bool = False
    registries: list[bytes] = field(default_factory=list)
    has_box: bytearray = field(default_factory=bytearray)
    registered: bytearray = field(default_factory=bytearray)
    registry: NDArray[np.int64] | None = None
    distributions: dict[tuple[int, int], bytes] = field(default_factory=dict)
    """(k, pool entry) -> the encrypted distribution."""


def _labels_distribution(entry: int, num_classes: int) -> NDArray[np.float64]:
    """Pool entry ``entry``'s label distribution: one main class and some noise."""
    rng = np.random.default_rng(entry)
    main = entry % num_classes
    labels = np.concatenate(
        [np.full(int(rng.integers(40, 80)), main), rng.integers(0, num_classes, 20)]
    )
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    return np.asarray(counts / counts.sum(), dtype=np.float64)


class SimulatedFleet:
    """N devices' reactions to the coordinator's messages (one transport for all).

    Args:
        federation: The federation id.
        devices: N.
        pool: Distinct label distributions (and ciphertexts) shared round-robin.
        seed: Identities, draws and pool entries derive from it.
        all_volunteer: Every registered device answers every announce (its
            draws, all False included), as devices did before issue 17.
    """

    def __init__(
        self,
        federation: str,
        devices: int,
        *,
        pool: int = 64,
        seed: int = 0,
        all_volunteer: bool = False,
    ) -> None:
        if devices < 1 or pool < 1:
            raise ValueError("need at least one device and one pool entry")
        self.federation = federation
        self.ids = [f"d{i:06d}" for i in range(devices)]
        self._index = {d: i for i, d in enumerate(self.ids)}
        self._seed = seed
        self._pool = pool
        self._all_volunteer = all_volunteer
        self._rng = np.random.default_rng(seed)
        self._public: list[tuple[bytes, bytes]] = []
        for i in range(devices):
            public = self._identity(i).public()
            self._public.append((public.x25519_public, public.ed25519_public))
        self.run = ""
        self._epoch: _Epoch | None = None
        self._announce: RoundAnnounce | None = None
        self._volunteers: list[SimulatedPublish] = []
        self.enrolled = 0
        self.key_epochs = 0
        self.volunteers_sent: dict[int, int] = {}
        self.explicit_rounds: set[int] = set()
        """Rounds whose announce asked every device to answer."""
        self.selected: dict[int, int] = {}
        """Round -> how many devices its `SelectionResult` named."""
        self.registry_parties = 0
        """Devices the last `RegistrySum` counts."""
        self.errors: Counter[str] = Counter()
        """`ErrorReply` codes the coordinator sent (a healthy run has none)."""
        self.finished = False

    # --- identities -------------------------------------------------------------

    def _identity(self, index: int) -> DeviceIdentity:
        digest = hashlib.sha256(f"ursa-bench|{self._seed}|{index}".encode()).digest()
        other = hashlib.sha256(digest).digest()
        return DeviceIdentity(
            self.ids[index],
            X25519PrivateKey.from_private_bytes(digest),
            Ed25519PrivateKey.from_private_bytes(other),
        )

    def public_identity(self, index: int) -> DevicePublicIdentity:
        """Device ``index``'s public identity (for pins)."""
        x25519, ed25519 = self._public[index]
        return DevicePublicIdentity(self.ids[index], x25519, ed25519)

    def fingerprints(self) -> dict[str, str]:
        """Every device's identity fingerprint (what `ursa coordinator enrol` pins)."""
        return {
            d: self.public_identity(i).fingerprint() for i, d in enumerate(self.ids)
        }

    # --- what devices send on their own --------------------------------------------

    def enrolment_messages(self) -> Iterator[SimulatedPublish]:
        """Every device's Hello, then its retained online status (made as sent)."""
        for i, device in enumerate(self.ids):
            x25519, ed25519 = self._public[i]
            hello = Hello(
                federation=self.federation,
                round=0,
                sender=device,
                device_id=device,
                x25519_public=x25519,
                ed25519_public=ed25519,
            )
            status = Status(
                federation=self.federation,
                round=0,
                sender=device,
                online=True,
                state="online",
            )
            first = self._outgoing(hello)
            yield SimulatedPublish(first.topic, first.payload, first.qos, burst=True)
            yield SimulatedPublish(
                status_topic(self.federation, device), encode(status), 1, True
            )

    def _outgoing(self, message: BaseMessage) -> SimulatedPublish:
        name = name_for(message_kind(message))
        topic = up_topic(self.federation, message.sender, name)
        return SimulatedPublish(topic, encode(message), qos_for(name), False)

    def _signed(self, identity: DeviceIdentity, message: _M) -> _M:
        signature = identity.sign(signing_bytes(message))
        return message.model_copy(update={"signature": signature})

    # --- reactions ------------------------------------------------------------------

    def react(
        self, topic: str, payload: bytes
    ) -> tuple[str, Iterator[SimulatedPublish]]:
        """What the devices do on a message from the coordinator: (kind, messages).

        The messages are produced lazily, so a page of sealed keys or a
        round's volunteers is not held in memory at once.
        """
        if not payload:
            return "", iter(())
        try:
            parsed = parse_topic(topic)
            message = decode(payload)
        except ProtocolError:
            self.errors["undecodable"] += 1
            return "", iter(())
        kind = message_kind(message)
        device = parsed.device if parsed.direction == "down" else None
        if isinstance(message, EnrolResult):
            self._on_enrol_result(message)
        elif isinstance(message, ErrorReply):
            self.errors[message.code] += 1
        elif isinstance(message, KeyEpochStart):
            self._on_key_epoch_start(message)
        elif isinstance(message, SealRequest):
            return kind, self._on_seal_request(device, message)
        elif isinstance(message, AgentPublicKey):
            return kind, self._on_agent_public_key(message)
        elif isinstance(message, SealedSecretKey) and device is not None:
            return kind, self._on_sealed_secret_key(message)
        elif isinstance(message, RegistryCheck):
            return kind, self._on_registry_check(message)
        elif isinstance(message, RegistrySum):
            self._on_registry_sum(message)
        elif isinstance(message, RoundAnnounce):
            return kind, self._on_round_announce(message)
        elif isinstance(message, TryAssignment) and device is not None:
            return kind, self._on_try_assignment(device, message)
        elif isinstance(message, TrySums):
            return kind, self._on_try_sums(message)
        elif isinstance(message, SelectionResult):
            self.selected[message.round] = len(message.selected)
        elif kind == "federation_end":
            self.finished = True
        return kind, iter(())

    def _on_enrol_result(self, message: EnrolResult) -> None:
        if not message.accepted:
            self.errors["enrolment_refused"] += 1
            return
        self.run = message.run
        self.enrolled += 1

    def _on_key_epoch_start(self, message: KeyEpochStart) -> None:
        epoch = self._epoch
        if epoch is not None and message.epoch <= epoch.notice.epoch:
            return
        codebook = Codebook(message.num_classes, message.groups)
        distributions = np.stack(
            [_labels_distribution(j, message.num_classes) for j in range(self._pool)]
        )
        thresholds = dict(zip(message.groups, message.sigma, strict=True))
        slots = registry_indices(distributions, codebook, thresholds)
        n = len(self.ids)
        self._epoch = _Epoch(
            message,
            self._index[message.agent],
            slots,
            has_box=bytearray(n),
            registered=bytearray(n),
        )
        self._announce = None
        self.key_epochs += 1

    def _on_seal_request(
        self, device: str | None, message: SealRequest
    ) -> Iterator[SimulatedPublish]:
        """The agent's key (once per epoch), then the page's boxes in `SealedKeys`.

        The device the page is addressed to seals it (the epoch's agent unless
        the coordinator spreads sealing over several devices).
        """
        epoch = self._epoch
        if epoch is None or message.epoch != epoch.notice.epoch:
            return
        notice = epoch.notice
        agent = self._identity(epoch.agent)
        sealer_index = self._index.get(device or "", epoch.agent)
        sealer = agent if sealer_index == epoch.agent else self._identity(sealer_index)
        if epoch.secret_key is None:
            public_key, secret_key = generate_keypair(notice.key_bits)
            epoch.secret_key = secret_key
            layout = PackingLayout(1, notice.max_parties, notice.key_bits)
            codebook = Codebook(notice.num_classes, notice.groups)
            epoch.registries = [
                encrypt_vector(
                    public_key, layout, registry_vector(int(s), codebook).tolist()
                ).to_bytes(public_key)
                for s in epoch.slots
            ]
            me = agent.device_id
            announce = AgentPublicKey(
                federation=self.federation,
                run=self.run,
                round=0,
                sender=me,
                message_id=derived_id(me, "public-key", notice.epoch),
                epoch=notice.epoch,
                public_key=public_key.to_bytes(),
            )
            yield self._outgoing(self._signed(agent, announce))
        secret_key = epoch.secret_key
        context = seal_context(self.federation, notice.epoch)
        plaintext = secret_key.secret_to_bytes()
        me = sealer.device_id
        boxes = []
        for keys in message.recipients:
            if keys.device_id in (me, agent.device_id):
                continue
            receiver = DevicePublicIdentity(
                keys.device_id, keys.x25519_public, keys.ed25519_public
            )
            box = seal(sealer, receiver, context, plaintext)
            boxes.append(SealedBox(recipient=keys.device_id, box=box))
        for part, chunk in enumerate(split_boxes(boxes)):  # as the real agent does
            page = SealedKeys(
                federation=self.federation,
                run=self.run,
                round=0,
                sender=me,
                message_id=derived_id(
                    me, "boxes", notice.epoch, message.message_id, part
                ),
                epoch=notice.epoch,
                page=message.page,
                boxes=chunk,
            )
            yield self._outgoing(page)
        for holder in {epoch.agent, sealer_index}:  # they hold the key already
            epoch.has_box[holder] = 1
            yield from self._register(epoch, holder)

    def _on_agent_public_key(
        self, message: AgentPublicKey
    ) -> Iterator[SimulatedPublish]:
        epoch = self._epoch
        if epoch is None or message.epoch != epoch.notice.epoch:
            return
        epoch.public_key_seen = True
        for i in range(len(self.ids)):  # boxes that came before the key
            if epoch.has_box[i] and not epoch.registered[i]:
                yield from self._register(epoch, i)

    def _on_sealed_secret_key(
        self, message: SealedSecretKey
    ) -> Iterator[SimulatedPublish]:
        epoch = self._epoch
        if epoch is None or message.epoch != epoch.notice.epoch:
            return
        index = self._index.get(message.recipient)
        if index is None:
            return
        epoch.has_box[index] = 1
        yield from self._register(epoch, index)

    def _register(self, epoch: _Epoch, index: int) -> Iterator[SimulatedPublish]:
        """Send device ``index``'s registration once it holds the key (once)."""
        if not (epoch.public_key_seen or index == epoch.agent):
            return
        if epoch.registered[index] or not epoch.registries:
            return
        epoch.registered[index] = 1
        device = self.ids[index]
        yield self._outgoing(
            Registration(
                federation=self.federation,
                run=self.run,
                round=0,
                sender=device,
                message_id=derived_id(device, "registration", epoch.notice.epoch),
                epoch=epoch.notice.epoch,
                registry=epoch.registries[index % self._pool],
            )
        )

    def _on_registry_sum(self, message: RegistrySum) -> None:
        epoch = self._epoch
        if epoch is None or epoch.secret_key is None:
            return
        if message.epoch != epoch.notice.epoch or epoch.registry is not None:
            return
        notice = epoch.notice
        vector = encrypted_vector_from(
            message.registry_sum, epoch.secret_key.public_key
        )
        layout = PackingLayout(1, notice.max_parties, notice.key_bits)
        registry = np.asarray(
            decrypt_vector(epoch.secret_key, layout, vector), dtype=np.int64
        )
        if int(registry.sum()) != message.num_parties:
            self.errors["registry_sum_mismatch"] += 1
        epoch.registry = registry
        self.registry_parties = message.num_parties

    def _on_round_announce(self, message: RoundAnnounce) -> Iterator[SimulatedPublish]:
        epoch = self._epoch
        if epoch is None or epoch.registry is None:
            return
        if message.epoch != epoch.notice.epoch:
            return
        known = self._announce
        if known is not None and known.round == message.round:
            yield from self._volunteers  # a re-announce: the same answers again
            return
        self._announce = message
        self._volunteers = self._draw(epoch, message)
        self.volunteers_sent[message.round] = len(self._volunteers)
        yield from self._volunteers

    def _draw(self, epoch: _Epoch, announce: RoundAnnounce) -> list[SimulatedPublish]:
        """The registered devices' H coins each; who volunteers, as Volunteers."""
        registry = epoch.registry
        assert registry is not None
        members = np.flatnonzero(np.frombuffer(bytes(epoch.registered), np.uint8))
        slots = epoch.slots[members % self._pool]
        members, slots = members[registry[slots] > 0], slots[registry[slots] > 0]
        probability = participation_probabilities(registry, slots, announce.k)
        draws = self._rng.random((members.size, announce.tries)) < probability[:, None]
        answering = np.arange(members.size)
        if announce.explicit_replies:
            self.explicit_rounds.add(announce.round)
        elif not self._all_volunteer:  # silence means no
            answering = np.flatnonzero(draws.any(axis=1))
        out = []
        for row in answering:
            device = self.ids[int(members[row])]
            out.append(
                self._outgoing(
                    Volunteer(
                        federation=self.federation,
                        run=self.run,
                        round=announce.round,
                        sender=device,
                        message_id=derived_id(
                            device, "volunteer", announce.epoch, announce.round
                        ),
                        draws=tuple(bool(d) for d in draws[row]),
                    )
                )
            )
        return out

    def _on_try_assignment(
        self, device: str, message: TryAssignment
    ) -> Iterator[SimulatedPublish]:
        epoch, announce = self._epoch, self._announce
        index = self._index.get(device)
        if epoch is None or epoch.secret_key is None or index is None:
            return
        if announce is None or announce.round != message.round:
            return
        entry = index % self._pool
        blob = epoch.distributions.get((announce.k, entry))
        if blob is None:
            public_key = epoch.secret_key.public_key
            distribution = _labels_distribution(entry, epoch.notice.num_classes)
            blob = encrypt_reals(
                public_key, DISTRIBUTION_CODEC, announce.k, distribution
            ).to_bytes(public_key)
            epoch.distributions[(announce.k, entry)] = blob
        yield self._outgoing(
            EncryptedDistribution(
                federation=self.federation,
                run=self.run,
                round=message.round,
                sender=device,
                message_id=derived_id(
                    device, "distribution", announce.epoch, message.round
                ),
                distribution=blob,
            )
        )

    def _on_registry_check(self, message: RegistryCheck) -> Iterator[SimulatedPublish]:
        """The agent's verdict: every registration here is an honest pool entry.

        The simulated registrations are the pool's one-hot ones, so the agent
        names none bad without decrypting them (its cost is the device's,
        not the coordinator's this bench measures).
        """
        epoch = self._epoch
        if epoch is None:
            return
        agent = self._identity(epoch.agent)
        me = agent.device_id
        verdict = RegistryVerdict(
            federation=self.federation,
            run=self.run,
            round=0,
            sender=me,
            message_id=derived_id(me, "registry_verdict", message.message_id),
            epoch=message.epoch,
            page=message.page,
            entries=len(message.registries),
        )
        yield self._outgoing(self._signed(agent, verdict))

    def _on_try_sums(self, message: TrySums) -> Iterator[SimulatedPublish]:
        epoch, announce = self._epoch, self._announce
        if epoch is None or epoch.secret_key is None or announce is None:
            return
        secret_key = epoch.secret_key
        sums = [
            decrypt_real_sum(
                secret_key,
                DISTRIBUTION_CODEC,
                announce.k,
                encrypted_vector_from(blob, secret_key.public_key),
            )
            for blob in message.sums
        ]
        best = best_try(np.stack(sums), np.asarray(message.member_counts))
        agent = self._identity(epoch.agent)
        me = agent.device_id
        answer = AgentAnswer(
            federation=self.federation,
            run=self.run,
            round=message.round,
            sender=me,
            message_id=derived_id(me, "answer", announce.epoch, message.round),
            best_try=best,
        )
        yield self._outgoing(self._signed(agent, answer))
