"""An operator that certifies a whole fleet at once: `ursa demo`'s and the tests'.

A field trial's operator runs `ursa operator certify` once per party, on a
machine apart from the coordinator. A demo (and a test) plays every role on
one host: `OperatorProvisioning.device` and `.coordinator` create the party's
identity in its state directory (the SDK and the service load that file),
certify it with a fresh operator key and return the ``[trust]`` section that
names the certificate file, so the run is in ``operator`` mode like a trial.
"""

from __future__ import annotations

from pathlib import Path

from ursa.crypto.certificate import OperatorKey, Role
from ursa.crypto.identity import DeviceIdentity
from ursa.crypto.secret_file import ensure_private_dir
from ursa.protocol.messages import COORDINATOR
from ursa.protocol.trust_config import TrustConfig
from ursa.tools.cli.operator import certify

__all__ = ["OperatorProvisioning"]


class OperatorProvisioning:
    """A fresh operator key and the certificates it issued (under ``directory``)."""

    def __init__(self, directory: Path, federation: str) -> None:
        self.key = OperatorKey.generate()
        self.directory = directory
        self.federation = federation
        ensure_private_dir(directory, "operator")

    def device(self, state_dir: Path, device_id: str) -> TrustConfig:
        """The ``[trust]`` of a certified device (its identity in ``state_dir``)."""
        identity = DeviceIdentity.load_or_create(state_dir, device_id)
        return self._certified(identity, Role.DEVICE)

    def coordinator(self, state_dir: Path) -> TrustConfig:
        """The ``[trust]`` of the certified coordinator of ``state_dir``."""
        identity = DeviceIdentity.load_or_create(state_dir, COORDINATOR)
        return self._certified(identity, Role.COORDINATOR)

    def trust(self, certificate: Path) -> TrustConfig:
        """``[trust]`` with this operator's key and ``certificate``."""
        return TrustConfig(
            operator_public_key=self.key.public().hex(), certificate=certificate
        )

    def _certified(self, identity: DeviceIdentity, role: Role) -> TrustConfig:
        certificate = certify(
            self.key, role, identity.public(), federation=self.federation
        )
        path = self.directory / f"{identity.device_id}.cert"
        path.write_text(certificate.to_text())
        return self.trust(path)
