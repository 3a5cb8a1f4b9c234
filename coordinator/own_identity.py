"""The coordinator's own identity: its signing key, its public file, its certificate.

Devices pin the identity (TOFU, or by config from ``coordinator.pub``), so
the key is loaded (or made, once) from ``identity_key`` at start, and its
public half is written to ``<state_dir>/coordinator.pub`` first, so a start
whose operator certificate is not issued yet still leaves what to certify.
With an operator trust anchor the certificate is checked against it
(`ursa.protocol.trust_config`); under TOFU it is empty.
"""

from __future__ import annotations

from ursa.coordinator.config import CoordinatorConfig
from ursa.crypto.certificate import Role
from ursa.crypto.identity import DeviceIdentity, DevicePublicIdentity
from ursa.crypto.secret_file import ensure_private_dir
from ursa.crypto.trust_anchor import TrustAnchor
from ursa.protocol.messages import COORDINATOR

__all__ = ["IDENTITY_PUBLIC_FILENAME", "OwnIdentity"]

IDENTITY_PUBLIC_FILENAME = "coordinator.pub"
"""Hex of the coordinator's public identity, for devices that pin it by config."""


class OwnIdentity:
    """The coordinator's identity, once `load` ran (module docstring).

    Args:
        config: The state dir, ``identity_key`` and ``[trust]``.
        trust: The operator trust anchor (tofu: none).
    """

    def __init__(self, config: CoordinatorConfig, trust: TrustAnchor) -> None:
        self._config = config
        self._trust = trust
        self._identity: DeviceIdentity | None = None
        self.certificate = b""
        """The coordinator's operator certificate (b"": tofu)."""

    def load(self) -> DeviceIdentity:
        """Load or make the key, write ``coordinator.pub``, check the certificate."""
        cfg = self._config
        ensure_private_dir(cfg.state_dir, "coordinator state")
        identity = DeviceIdentity.load_or_create(
            cfg.state_dir, COORDINATOR, key_path=cfg.identity_key_path()
        )
        public = identity.public()
        (cfg.state_dir / IDENTITY_PUBLIC_FILENAME).write_text(
            f"{public.to_bytes().hex()}\nfingerprint {public.fingerprint()}\n"
        )  # first, so a start without its certificate yet leaves what to certify
        self.certificate = cfg.trust.own_certificate(
            self._trust, public, Role.COORDINATOR
        )
        self._identity = identity
        return identity

    @property
    def public(self) -> DevicePublicIdentity:
        """The public signing identity (after `load`)."""
        if self._identity is None:
            raise RuntimeError("the coordinator's identity is not loaded yet")
        return self._identity.public()
