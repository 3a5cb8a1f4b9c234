"""Who may read the HTTP view: the Host check, the token gate, TLS.

Three defences, each owning its own state:

* `HostCheck` answers only ``Host`` values the operator expects. A
  DNS-rebinding page (``evil.example`` re-resolved to 127.0.0.1) makes the
  operator's browser send its own name, so IP literals (which no rebinding
  can produce), ``localhost``, the listen host and ``[http] allowed_hosts``
  pass and every other name is refused.
* `TokenGate` takes the token as ``Authorization: Bearer`` (Prometheus) or as
  a cookie the login form sets once. The cookie holds HMAC-SHA256(token,
  label), not the token, and every comparison is constant-time; the token
  never appears in a URL, a page or a log line.
* `tls_context` makes the server's TLS (>= 1.2) from a certificate and key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs

__all__ = [
    "COOKIE_NAME",
    "Headers",
    "HostCheck",
    "ObserveConfigError",
    "TlsFiles",
    "TokenGate",
    "host_name",
    "session_cookie",
    "tls_context",
]

COOKIE_NAME = "ursa_session"
_COOKIE_LABEL = b"ursa dashboard session cookie v1"
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")


class Headers(Protocol):
    """A request's headers: `http.client.HTTPMessage`, or a dict in tests."""

    def get(self, name: str, /) -> str | None:
        """The header's value, None without it."""


class ObserveConfigError(ValueError):
    """An HTTP view that may not start as configured (one line for the CLI)."""


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def host_name(header: str) -> str | None:
    """The host of a ``Host`` header, lower-case, without port or final dot.

    None for what is not ``name[:port]``, ``IPv4[:port]`` or ``[IPv6][:port]``.
    """
    text = header.strip().lower()
    if text.startswith("["):
        name, closed, rest = text[1:].partition("]")
        if not closed or not _is_ip(name):
            return None
        if rest and not (rest[0] == ":" and rest[1:].isdigit()):
            return None
        return name
    if text.count(":") > 1:  # a bare IPv6 literal (not valid, but unambiguous)
        return text if _is_ip(text) else None
    name, sep, port = text.partition(":")
    if sep and not port.isdigit():
        return None
    name = name.removesuffix(".")
    return name if _is_ip(name) or _NAME.fullmatch(name) else None


class HostCheck:
    """The ``Host`` values this view answers (DNS-rebinding defence).

    Args:
        listen_host: The address or name listened on (always allowed).
        names: Further names the operator serves it under.

    Raises:
        ObserveConfigError: a name that is not a host name (a port, a scheme).
    """

    def __init__(self, listen_host: str, names: Iterable[str] = ()) -> None:
        allowed = {"localhost", listen_host.lower().removesuffix(".")}
        for name in names:
            parsed = host_name(name)
            if parsed is None or (":" in name and not _is_ip(parsed)):
                raise ObserveConfigError(
                    f"[http] allowed_hosts {name!r}: expected a host name "
                    "(no scheme, no port)"
                )
            allowed.add(parsed)
        self._names = frozenset(allowed)

    @property
    def names(self) -> frozenset[str]:
        """The names allowed besides IP literals."""
        return self._names

    def allows(self, header: str | None) -> bool:
        """Whether a request with this ``Host`` header may be answered."""
        if header is None:
            return False  # HTTP/1.0 without Host: refuse, it names nothing
        name = host_name(header)
        return name is not None and (_is_ip(name) or name in self._names)


class TokenGate:
    """The token every request needs, by header or by cookie.

    Args:
        token: The operator's token (never logged, never sent back).
    """

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self._cookie = hmac.new(self._token, _COOKIE_LABEL, hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "TokenGate(<token hidden>)"

    def _matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def admits(self, headers: Headers) -> bool:
        """Whether a request carries the token as Bearer or as our cookie."""
        auth = headers.get("Authorization") or ""
        scheme, _, given = auth.partition(" ")
        if scheme.lower() == "bearer" and self._matches(given.strip()):
            return True
        cookie = session_cookie(headers.get("Cookie") or "")
        return cookie is not None and hmac.compare_digest(
            cookie.encode(), self._cookie.encode()
        )

    def login(self, form: bytes) -> bool:
        """Whether a login form (``token=...``, url-encoded) holds the token."""
        try:
            fields = parse_qs(form.decode(), max_num_fields=4)
        except (UnicodeDecodeError, ValueError):
            return False
        given = fields.get("token", [""])
        return len(given) == 1 and self._matches(given[0])

    def set_cookie(self, *, secure: bool) -> str:
        """The ``Set-Cookie`` value a right login answers with."""
        flags = "; Secure" if secure else ""
        return f"{COOKIE_NAME}={self._cookie}; HttpOnly; SameSite=Strict; Path=/{flags}"


def session_cookie(header: str) -> str | None:
    """Our cookie's value in a ``Cookie`` header (the first, if repeated)."""
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name == COOKIE_NAME:
            return value.strip()
    return None


@dataclass(frozen=True)
class TlsFiles:
    """A PEM certificate (chain) and its private key, for HTTPS."""

    cert: Path
    key: Path


def tls_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context, TLS 1.2 or newer, holding ``files``.

    Raises:
        ObserveConfigError: a file missing or unreadable, a key that does not
            match, or one with a passphrase (it would prompt).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key, password=_no_passphrase)
    except (OSError, TypeError) as exc:  # ssl.SSLError is an OSError
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None)
        raise ObserveConfigError(
            f"--http-tls {files.cert} {files.key}: cannot load "
            f"the certificate and key ({reason or exc})"
        ) from None
    return context


def _no_passphrase() -> bytes:
    raise TypeError("the key has a passphrase (give an unencrypted key file)")
