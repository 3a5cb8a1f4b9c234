"""`ursa operator init|certify`: the operator's key and the certificates it signs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.tools.cli.test_fleet import _device
from ursa.crypto.certificate import Certificate, OperatorKey, OperatorPublicKey, Role
from ursa.crypto.errors import UntrustedIdentityError
from ursa.crypto.identity import DeviceIdentity
from ursa.edge_sdk.config import load_device_config
from ursa.tools.cli.app import main


@pytest.fixture(autouse=True)
def _no_ursa_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("URSA_"):
            monkeypatch.delenv(name)


def test_init_makes_a_private_key_and_prints_only_the_public_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "operator"
    assert main(["operator", "init", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    key = OperatorKey.load(out / "operator.key")
    assert (out / "operator.key").stat().st_mode & 0o777 == 0o600
    assert out.stat().st_mode & 0o777 == 0o700
    assert key.public().hex() in printed and key.public().fingerprint() in printed
    assert (out / "operator.key").read_text().split('"')[-2] not in printed
    assert main(["operator", "init", "--out", str(out)]) == 1  # never replaced
    assert OperatorKey.load(out / "operator.key").public() == key.public()


def test_certify_a_device_from_its_identity_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "operator"
    main(["operator", "init", "--out", str(out)])
    config = _device(tmp_path)
    assert main(["device", "identity", "--config", str(config), "--json"]) == 0
    identity = json.loads(capsys.readouterr().out.splitlines()[-1])["public"]
    cert = tmp_path / "dev001.cert"
    argv = ["operator", "certify", "device", "--key", str(out / "operator.key")]
    argv += ["--federation", "f", "--identity", identity, "--out", str(cert)]
    assert main([*argv, "--days", "30"]) == 0
    certificate = Certificate.from_text(cert.read_text())
    public = OperatorPublicKey(OperatorKey.load(out / "operator.key").public().key)
    subject = public.verify(
        certificate, federation="f", role=Role.DEVICE, now=certificate.issued_at
    )
    state = tmp_path / "dev"
    assert subject == DeviceIdentity.load_or_create(state, "dev001").public()
    assert certificate.expires_at - certificate.issued_at == 30 * 86400
    assert main(argv) == 1  # an existing certificate file is not overwritten


def test_certify_refuses_a_coordinator_role_for_a_device(tmp_path: Path) -> None:
    out = tmp_path / "operator"
    main(["operator", "init", "--out", str(out)])
    device = DeviceIdentity.generate("dev001").public().to_bytes().hex()
    argv = ["operator", "certify", "coordinator", "--key", str(out / "operator.key")]
    argv += ["--federation", "f", "--identity", device]
    assert main([*argv, "--out", str(tmp_path / "c.cert")]) == 1
    assert not (tmp_path / "c.cert").exists()


def test_device_config_reads_the_trust_section(tmp_path: Path) -> None:
    key = OperatorKey.generate().public().hex()
    path = tmp_path / "device.toml"
    path.write_text(
        f'device_id = "dev001"\nfederation = "f"\nstate_dir = "{tmp_path}"\n'
        f'[trust]\noperator_public_key = "{key}"\ncertificate = "d.cert"\n'
    )
    trust = load_device_config(path, {}).trust
    assert trust.resolved_mode() == "operator"
    assert trust.operator_public_key == key


def test_trust_config_refuses_what_cannot_be_meant() -> None:
    from pydantic import ValidationError

    from ursa.protocol.trust_config import TrustConfig

    key = OperatorKey.generate().public().hex()
    assert TrustConfig().resolved_mode() == "tofu"
    for bad in (
        {"mode": "operator"},
        {"mode": "tofu", "operator_public_key": key, "certificate": "c"},
        {"operator_public_key": key},  # no certificate of its own
        {"operator_public_key": "00" * 31},
    ):
        with pytest.raises(ValidationError):
            TrustConfig.model_validate(bad)


def test_own_certificate_must_be_for_the_partys_keys(tmp_path: Path) -> None:
    from ursa.protocol.trust_config import TrustConfig
    from ursa.tools.cli.operator import certify

    operator = OperatorKey.generate()
    other = DeviceIdentity.generate("dev001").public()
    path = tmp_path / "c.cert"
    path.write_text(certify(operator, Role.DEVICE, other, federation="f").to_text())
    trust = TrustConfig(operator_public_key=operator.public().hex(), certificate=path)
    anchor = trust.anchor("f", "dev001")
    mine = DeviceIdentity.generate("dev001").public()
    with pytest.raises(UntrustedIdentityError, match="does not match"):
        trust.own_certificate(anchor, mine, Role.DEVICE)
    assert (
        trust.own_certificate(anchor, other, Role.DEVICE)
        == Certificate.from_text(path.read_text()).to_bytes()
    )
