"""The HTTP view over HTTPS: a real TLS request verified against the test's cert."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import logging
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.tools.observe.statuses import fixed_status
from ursa.coordinator.live_status import ServiceStatus
from ursa.tools.observe.access import TlsFiles, tls_context
from ursa.tools.observe.server import Listen, ObserveConfigError, ObserveServer

TOKEN = "tls-token-0123456789"


def _status() -> ServiceStatus:
    return fixed_status(round_index=3)


def _write_pair(
    directory: Path, name: str, passphrase: bytes | None = None
) -> TlsFiles:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ursa test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    files = TlsFiles(directory / f"{name}.pem", directory / f"{name}.key")
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )
    )
    return files


def _client(files: TlsFiles) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(files.cert))  # verifies 127.0.0.1


def test_https_is_served_and_verifies_against_the_certificate(tmp_path: Path) -> None:
    files = _write_pair(tmp_path, "view")
    with ObserveServer(_status, Listen("127.0.0.1", 0), token=TOKEN, tls=files) as view:
        assert view.url.startswith("https://127.0.0.1:")
        connection = http.client.HTTPSConnection(
            "127.0.0.1", view.port, timeout=10, context=_client(files)
        )
        try:
            connection.request(
                "GET", "/api/status", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            response = connection.getresponse()
            assert response.status == 200 and b'"round": 3' in response.read()
            connection.request(
                "POST",
                "/login",
                body=f"token={TOKEN}",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            response = connection.getresponse()
            response.read()
            assert response.status == 303
            assert response.headers["Set-Cookie"].endswith("; Secure")
        finally:
            connection.close()
        # a certificate the client does not trust is refused by the client
        with pytest.raises(ssl.SSLCertVerificationError):
            other = _client(_write_pair(tmp_path, "other"))
            with socket.create_connection(("127.0.0.1", view.port), timeout=10) as raw:
                other.wrap_socket(raw, server_hostname="127.0.0.1")


def test_a_stalled_handshake_does_not_block_the_next_client(tmp_path: Path) -> None:
    files = _write_pair(tmp_path, "view")
    with (
        ObserveServer(_status, Listen("127.0.0.1", 0), tls=files) as view,
        socket.create_connection(("127.0.0.1", view.port), timeout=10),
    ):
        # connected, and never says hello: another client is served meanwhile
        connection = http.client.HTTPSConnection(
            "127.0.0.1", view.port, timeout=10, context=_client(files)
        )
        try:
            connection.request("GET", "/api/status")
            assert connection.getresponse().status == 200
        finally:
            connection.close()


def test_plain_http_to_the_tls_port_gets_no_answer(tmp_path: Path) -> None:
    files = _write_pair(tmp_path, "view")
    with ObserveServer(_status, Listen("127.0.0.1", 0), tls=files) as view:
        connection = http.client.HTTPConnection("127.0.0.1", view.port, timeout=10)
        try:
            with pytest.raises((http.client.HTTPException, ConnectionError)):
                connection.request("GET", "/api/status")
                connection.getresponse()
        finally:
            connection.close()


def test_files_that_do_not_load_are_a_one_line_config_error(tmp_path: Path) -> None:
    good = _write_pair(tmp_path, "good")
    other = _write_pair(tmp_path, "other")
    locked = _write_pair(tmp_path, "locked", passphrase=b"secret")
    for files in (
        TlsFiles(tmp_path / "missing.pem", good.key),
        TlsFiles(good.cert, tmp_path / "missing.key"),
        TlsFiles(good.cert, other.key),  # not its key
        TlsFiles(good.key, good.cert),  # swapped
        locked,  # a passphrase: no prompt, an error
    ):
        with pytest.raises(ObserveConfigError, match=r"^--http-tls ") as caught:
            tls_context(files)
        assert "\n" not in str(caught.value) and "secret" not in str(caught.value)
    with pytest.raises(ObserveConfigError, match="cannot load"):
        ObserveServer(
            _status, Listen("127.0.0.1", 0), tls=TlsFiles(good.cert, other.key)
        )


def test_beyond_loopback_without_tls_a_warning_says_the_token_travels_in_clear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = _write_pair(tmp_path, "view")
    caplog.set_level(logging.INFO, "ursa.observe")
    for tls, listen in ((None, "127.0.0.1"), (files, "0.0.0.0"), (None, "0.0.0.0")):
        caplog.clear()
        with ObserveServer(_status, Listen(listen, 0), token=TOKEN, tls=tls):
            pass
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert bool(warned) is (tls is None and listen == "0.0.0.0"), (tls, listen)
        assert all(TOKEN not in r.getMessage() for r in caplog.records)
    assert "in clear" in warned[0].getMessage()
