"""The enrolled devices: who may take part, with what keys, and who refuses us.

Enrolment itself is decided by `decide_enrolment` (pure); this component
holds its outcome for the run: each enrolled device's identity keys and
operator certificate (persisted, relayed with its keys), the operator's
``enrolment.json`` (re-read when it changes, `EnrolmentWatch`), and the
devices that refused this coordinator's identity (they sit out until they
say Hello again). A device revoked, or enrolled again with new keys, on the
list is forgotten at start and as soon as the list changes while running.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from ursa.coordinator.config import CoordinatorConfig, EnrolmentConfig
from ursa.coordinator.enrolment import (
    EnrolmentDecision,
    decide_enrolment,
    identity_of,
)
from ursa.coordinator.enrolment_list import EnrolmentList, EnrolmentWatch
from ursa.coordinator.presence import Presence
from ursa.coordinator.refusal_log import RefusalLog, Stored
from ursa.coordinator.store_slot import StoreSlot
from ursa.crypto.errors import CryptoError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.trust_anchor import TrustAnchor
from ursa.protocol.messages import ErrorCode, Hello
from ursa.protocol.operator_commands import enrol_command

__all__ = ["REFUSING_KEY", "EnrolledDevices"]

logger = logging.getLogger("ursa.coordinator")

REFUSING_KEY = "refusing"
"""Store meta key: devices that refused this coordinator's identity."""


class EnrolledDevices:
    """The run's enrolled devices and refusals (module docstring).

    The three collections are public and live (read-only to others): the
    key epoch relays the keys and certificates, and the service counts who
    is ready from them.

    Args:
        config: The service configuration (state dir, enrolment policy).
        trust: The operator trust anchor a Hello's certificate is checked by.
        presence: Told when a device enrols (it is online: it said Hello).
        refusals: Writes refusal lines within the per-device limits.
        clock: Seconds (enrolment times, refusal limits).
        changed: Called with a device whose enrolment or refusal changed.
        store: The runtime's store (enrolments, certificates, refusals).
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        trust: TrustAnchor | None,
        presence: Presence,
        refusals: RefusalLog,
        clock: Callable[[], float],
        changed: Callable[[str], None],
        store: StoreSlot,
    ) -> None:
        self._config = config
        self._trust = trust
        self._presence = presence
        self._refusals = refusals
        self._clock = clock
        self._changed = changed
        self._store = store
        self._watch: EnrolmentWatch | None = None
        self._reads_applied = 0
        """`EnrolmentWatch.reads` when the list was last applied (start, ticks)."""
        self.identities: dict[str, DevicePublicIdentity] = {}
        self.certificates: dict[str, bytes] = {}
        """Enrolled devices' operator certificates, relayed with their keys."""
        self.refusing: set[str] = set()
        """Enrolled devices that refused this coordinator's identity (not counted)."""

    def restore(self) -> None:
        """Load the enrolled devices from the store, less the stale ones."""
        store = self._store.store
        self.identities.clear()  # in place: readers hold these collections
        self.identities.update(
            (d, DevicePublicIdentity.from_bytes(b)) for d, b in store.enrolled().items()
        )
        self.certificates.clear()
        self.certificates.update(store.certificates())
        self._forget_stale(self.listed()[0])
        if self._watch is not None:  # applied: ticks skip it until it changes
            self._reads_applied = self._watch.reads
        refusing = store.get_meta(REFUSING_KEY)
        self.refusing.clear()
        self.refusing.update(json.loads(refusing) if refusing else ())

    def listed(self) -> tuple[EnrolmentList, EnrolmentConfig]:
        """The operator's list and the policy merged with it (re-read on change)."""
        watch = self._watch
        if watch is None:
            watch = EnrolmentWatch(self._config.state_dir, self._config.enrolment)
            self._watch = watch
        return watch.current()

    def revocations(self) -> dict[str, str]:
        """Forget what a changed enrolment list revokes; the forgotten, with why.

        A ``stat`` per call (`EnrolmentWatch`); the O(fleet) comparison only
        when the file changed.
        """
        listed, _ = self.listed()
        watch = self._watch
        if watch is None or watch.reads == self._reads_applied:
            return {}
        self._reads_applied = watch.reads
        return self._forget_stale(listed)

    def _forget_stale(self, listed: EnrolmentList) -> dict[str, str]:
        """Forget devices revoked, or enrolled again with new keys, by command."""
        store = self._store.store
        fingerprints = {d: i.fingerprint() for d, i in self.identities.items()}
        stale = listed.stale_devices(fingerprints)
        for device, reason in sorted(stale.items()):
            logger.warning("forgetting enrolled device %s: %s", device, reason)
            store.unenrol(device)
            del self.identities[device]
            self.certificates.pop(device, None)
            self._changed(device)
        return stale

    def hello(self, message: Hello) -> EnrolmentDecision:
        """Decide a Hello; enrol a new device, keep a renewed certificate.

        A device that refused us is taken back first (a new try, e.g. after
        `ursa device repin`); a refusal is logged within the limits.
        """
        store = self._store.store
        device = message.sender  # admission checked it is the topic's device
        if device in self.refusing:
            self.refusing.discard(device)
            self._changed(device)
            self._save_refusing()
        listed, policy = self.listed()
        known = self.identities.get(device)
        decision = decide_enrolment(message, known, policy, listed.revoked, self._trust)
        if decision.accepted and decision.is_new and decision.identity is not None:
            identity = decision.identity
            store.enrol(
                device, identity.to_bytes(), identity.fingerprint(), self._clock()
            )
            self.identities[device] = identity
            self._presence.arrived(device)
            self._changed(device)
            store.set_online(device, True)
            logger.info("enrolled %s (%s)", device, identity.fingerprint())
        certificate = bytes(message.certificate)
        if decision.accepted and certificate != self.certificates.get(device, b""):
            store.set_certificate(device, certificate)  # checked, or renewed
            self.certificates[device] = certificate
        elif not decision.accepted:
            try:
                fingerprint = identity_of(message).fingerprint()
            except CryptoError:
                fingerprint = "(invalid keys)"
            self._refusals.write(
                self._clock(),
                device,
                logging.WARNING,
                "refused enrolment of %s (fingerprint %s): %s; to admit it: %s",
                device,
                fingerprint,
                decision.reason,
                enrol_command(device, fingerprint),
                kind="refused_enrolment",
                stored=Stored("hello", "refused", decision.reason),
            )
        return decision

    def refused_by(self, device: str, reason: str) -> bool:
        """A device pinned another coordinator: name it and the remedy; count it out.

        False if it was refusing already.
        """
        if device in self.refusing:
            return False
        self._refusals.write(
            self._clock(),
            device,
            logging.ERROR,
            "%s refuses this coordinator (%s); it sits out until re-pinned "
            "(`ursa device repin` on it) or this coordinator's identity.key is "
            "restored from backup",
            device,
            reason,
            kind=ErrorCode.COORDINATOR_IDENTITY_MISMATCH,
        )
        self.refusing.add(device)
        self._changed(device)
        self._save_refusing()
        return True

    def _save_refusing(self) -> None:
        self._store.store.set_meta(REFUSING_KEY, json.dumps(sorted(self.refusing)))
