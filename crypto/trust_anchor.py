"""Whom a party believes a relayed identity belongs to: the operator, or the relay.

`TrustAnchor` is what a device (and the coordinator, for Hellos) asks before
it seals to, opens from or verifies with keys it did not generate. Under an
operator key it demands a certificate that key signed for these exact keys,
this federation and role, valid now; in ``tofu`` mode (no operator key, a
lab) it takes the keys as presented, which means trusting whoever relays them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ursa.crypto.certificate import Certificate, OperatorPublicKey, Role
from ursa.crypto.errors import UntrustedIdentityError
from ursa.crypto.identity import DevicePublicIdentity

__all__ = ["TrustAnchor"]


class TrustAnchor:
    """Checks presented identities against operator certificates (or not, in tofu).

    Args:
        operator: The operator's public key; None trusts presented keys (tofu).
        federation: The federation certificates must name.
        clock: Unix seconds (certificates' validity).
    """

    def __init__(
        self,
        operator: OperatorPublicKey | None,
        federation: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._operator = operator
        self._federation = federation
        self._clock = clock

    @property
    def mode(self) -> str:
        """``operator`` or ``tofu``."""
        return "tofu" if self._operator is None else "operator"

    @property
    def operator(self) -> OperatorPublicKey | None:
        """The operator's public key (None in tofu mode)."""
        return self._operator

    def check(
        self,
        claimed: DevicePublicIdentity,
        certificate: bytes,
        role: Role = Role.DEVICE,
    ) -> DevicePublicIdentity:
        """``claimed`` if ``certificate`` vouches for exactly these keys.

        Raises:
            UntrustedIdentityError: no certificate, or one that does not verify,
                is for another subject, federation or role, or is not valid now.
        """
        if self._operator is None:
            return claimed
        who = claimed.device_id
        if not certificate:
            raise UntrustedIdentityError(f"no operator certificate for {who!r}")
        parsed = Certificate.from_bytes(certificate)
        subject = self._operator.verify(
            parsed, federation=self._federation, role=role, now=self._clock()
        )
        if subject != claimed:
            raise UntrustedIdentityError(
                f"operator certificate of {subject.device_id!r} "
                f"({subject.fingerprint()}) does not match the keys presented for "
                f"{who!r} ({claimed.fingerprint()})"
            )
        return claimed
