"""A CA and a server certificate for the broker, made with the openssl CLI."""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

__all__ = ["TlsError", "make_tls_files"]


class TlsError(RuntimeError):
    """openssl is missing or failed."""


def make_tls_files(
    tls_dir: Path, hostnames: Iterable[str] = ("localhost", "127.0.0.1")
) -> tuple[Path, Path, Path]:
    """Make a CA and a server certificate for `hostnames` with the openssl CLI.

    Returns:
        (ca.crt, server.crt, server.key). `ca.key` is left in `tls_dir` (0600):
        move it offline once the server certificate is made.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TlsError("TLS needs the openssl command (apt install openssl)")
    names = list(hostnames)
    if not names:
        raise ValueError("TLS needs at least one host name or IP address")
    tls_dir.mkdir(parents=True, exist_ok=True)
    san = ",".join(f"{'IP' if _is_ip(h) else 'DNS'}:{h}" for h in names)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (tls_dir / "server.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    commands = [
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
         "-subj", "/CN=ursa broker CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *ec, "-keyout", "server.key", "-out", "server.csr",
         "-subj", f"/CN={names[0]}"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-set_serial", f"0x{secrets.token_hex(16)}", "-days", "825",
         "-extfile", "server.ext", "-out", "server.crt"],
    ]  # fmt: skip
    for args in commands:
        done = subprocess.run(
            [openssl, *args], cwd=tls_dir, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise TlsError(f"openssl {args[0]} failed: {done.stderr.strip()}")
    for key in ("ca.key", "server.key"):
        (tls_dir / key).chmod(0o600)
    for scratch in ("server.csr", "server.ext"):
        (tls_dir / scratch).unlink()
    return tls_dir / "ca.crt", tls_dir / "server.crt", tls_dir / "server.key"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
