"""The ``[trust]`` section both sides share: whom relayed identities must be vouched by.

::

    [trust]
    operator_public_key = "<64 hex>"   # from `ursa operator init`
    certificate = "/etc/ursa/dev001.cert"   # this party's, from `ursa operator certify`
    # mode = "operator"                # the default when a key is set; "tofu": a lab

With an operator key (mode ``operator``) a device checks the coordinator's,
the agent's, every ring member's, secure-aggregation peer's and seal
recipient's keys against the operator's certificates, and the coordinator
enrols only devices whose Hello carries one. Without one (``tofu``) everyone
takes the keys the coordinator relays, which a coordinator that departs from
the protocol can replace: the party logs a WARNING saying so at start.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self

from ursa.crypto.certificate import Certificate, OperatorPublicKey, Role
from ursa.crypto.errors import UntrustedIdentityError
from ursa.crypto.identity import DevicePublicIdentity
from ursa.crypto.trust_anchor import TrustAnchor

__all__ = ["TrustConfig"]

logger = logging.getLogger("ursa.protocol")


class TrustConfig(BaseModel):
    """Operator trust: the operator's public key and this party's certificate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["operator", "tofu"] | None = None
    """None: ``operator`` when `operator_public_key` is set, else ``tofu``."""
    operator_public_key: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The operator's Ed25519 public key (64 hex; ``ursa operator init`` prints
    it): every party's identity must carry its certificate."""
    certificate: Path | None = None
    """This party's operator certificate (armoured text file)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.mode == "operator" and self.operator_public_key is None:
            raise ValueError('[trust] mode = "operator" needs operator_public_key')
        if self.mode == "tofu" and self.operator_public_key is not None:
            raise ValueError('[trust] mode = "tofu" with an operator_public_key set')
        if self.resolved_mode() == "operator" and self.certificate is None:
            raise ValueError("[trust] operator mode needs this party's certificate")
        return self

    def resolved_mode(self) -> Literal["operator", "tofu"]:
        """The mode in force (see `mode`)."""
        if self.mode is not None:
            return self.mode
        return "tofu" if self.operator_public_key is None else "operator"

    def anchor(self, federation: str, what: str) -> TrustAnchor:
        """The party's `TrustAnchor`; in tofu mode, logs the WARNING it deserves."""
        if self.operator_public_key is None:
            logger.warning(
                "%s: trust mode tofu: devices take the agent's, ring members' and "
                "peers' keys from the coordinator, so a coordinator that departs "
                "from the protocol can read their sums; set [trust] "
                "operator_public_key outside a lab",
                what,
            )
            return TrustAnchor(None, federation)
        operator = OperatorPublicKey.from_hex(self.operator_public_key)
        logger.info("%s: trust mode operator (key %s)", what, operator.fingerprint())
        return TrustAnchor(operator, federation)

    def own_certificate(
        self, anchor: TrustAnchor, identity: DevicePublicIdentity, role: Role
    ) -> bytes:
        """This party's certificate, checked against its own keys (b"" in tofu).

        Raises:
            UntrustedIdentityError: unreadable, or not a valid certificate of
                ``identity`` (a misprovisioned party stops at start).
        """
        if anchor.operator is None or self.certificate is None:
            return b""
        try:
            text = Path(self.certificate).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise UntrustedIdentityError(
                f"cannot read certificate {self.certificate}: {exc}"
            ) from exc
        certificate = Certificate.from_text(text).to_bytes()
        anchor.check(identity, certificate, role)
        expires = Certificate.from_bytes(certificate).expires_at
        logger.info(
            "%s: operator certificate valid until %s",
            identity.device_id,
            time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(expires)),
        )
        return certificate
