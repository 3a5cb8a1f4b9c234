"""CA and server certificate generation with the openssl CLI."""

from __future__ import annotations

import shutil
import ssl
import stat
import subprocess
from pathlib import Path

import pytest

from ursa.tools.broker.tls import make_tls_files


def test_tls_files_form_a_verifiable_chain(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    ca, cert, key = make_tls_files(tmp_path, ["localhost", "127.0.0.1"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    done = subprocess.run(
        ["openssl", "verify", "-CAfile", str(ca), str(cert)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(cert, key)  # key matches the certificate


def test_certificate_names_hosts_and_ips(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    _, cert, _ = make_tls_files(tmp_path, ["broker.lan", "10.0.0.5"])
    text = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:broker.lan" in text
    assert "IP Address:10.0.0.5" in text


def test_needs_a_host_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        make_tls_files(tmp_path, [])
