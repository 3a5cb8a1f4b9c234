"""The operator's HTTP view: dashboard, ``/api/status`` and ``/metrics``, read-only.

Routes (GET and HEAD only; everything else is 405)::

    /               the dashboard page (static HTML; its script polls /api/status)
    /dashboard.js   the page's script (hand-written, draws on <canvas>)
    /dashboard.css  its style sheet
    /api/status     `ServiceStatus.to_json` of the coordinator now
    /metrics        Prometheus exposition (needs prometheus_client: the ops extra)

Every asset comes from this package (no CDN, no build step), so the page works
on a field network without internet. The stdlib `ThreadingHTTPServer` serves
in a daemon thread; nothing it does can stop the coordinator (a failing
status read is a 500 and a log line).

Access: loopback by default. Binding any other address needs a token
(`ObserveConfigError` otherwise), and once a token is set every request must
carry it, as ``Authorization: Bearer <token>`` (Prometheus' ``authorization``
scrape setting) or ``?token=<token>`` (a browser; the page passes it on to
its own requests); without it the answer is 401. The token is never logged.
"""

from __future__ import annotations

import hmac
import html
import ipaddress
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

from ursa.coordinator.live_status import ServiceStatus, service_status
from ursa.coordinator.telemetry import RecentErrors

if TYPE_CHECKING:
    from ursa.coordinator.service import CoordinatorService

__all__ = [
    "OPS_EXTRA_HINT",
    "Listen",
    "ObserveConfigError",
    "ObserveServer",
    "observe_service",
    "parse_listen",
]

logger = logging.getLogger("ursa.observe")

OPS_EXTRA_HINT = "/metrics needs prometheus_client: pip install 'ursa-fl[ops]'"

_ASSETS = {
    "/": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
_SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; "
        "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'"
    ),
}


class ObserveConfigError(ValueError):
    """An HTTP view that may not start as configured (one line for the CLI)."""


@dataclass(frozen=True)
class Listen:
    """Where the HTTP view listens."""

    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        """True for 127.0.0.0/8, ::1 and ``localhost``."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve anywhere


def parse_listen(text: str) -> Listen:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6; a bare ``PORT`` means loopback).

    Raises:
        ObserveConfigError: not an address and a port 0-65535.
    """
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ObserveConfigError(f"--http {text!r}: expected HOST:PORT")
    return Listen(host, int(port))


class ObserveServer:
    """The HTTP view of one coordinator, served from a daemon thread.

    Args:
        source: Returns the coordinator's status now (any thread).
        listen: Address and port (port 0: any free one; see `port`).
        token: Required on every request when set; needed off loopback.

    Raises:
        ObserveConfigError: a non-loopback address without a token.
    """

    def __init__(
        self,
        source: Callable[[], ServiceStatus],
        listen: Listen,
        *,
        token: str | None = None,
    ) -> None:
        if not listen.is_loopback and not token:
            raise ObserveConfigError(
                f"--http {listen.host}: binding beyond loopback needs a token "
                "(--http-token, or [http] token / URSA_HTTP__TOKEN)"
            )
        self._source = source
        self._listen = listen
        self._token = token or None
        self._metrics: Callable[[], bytes] | None = None
        self._metrics_type = "text/plain"
        try:
            from ursa.tools.observe.metrics import (
                CONTENT_TYPE,
                metrics_registry,
                render,
            )
        except ImportError:
            logger.warning("%s", OPS_EXTRA_HINT)
        else:
            registry = metrics_registry(source)
            self._metrics = lambda: render(registry)
            self._metrics_type = CONTENT_TYPE
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._on_stop: list[Callable[[], None]] = []

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the server stops (undo what serving it set up)."""
        self._on_stop.append(callback)

    @property
    def port(self) -> int:
        """The port listened on (after `start`; the configured one before)."""
        httpd = self._httpd
        return self._listen.port if httpd is None else int(httpd.server_address[1])

    @property
    def url(self) -> str:
        """The dashboard's URL (without the token)."""
        host = self._listen.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    def start(self) -> ObserveServer:
        """Bind and serve in a daemon thread.

        Raises:
            ObserveConfigError: the address cannot be bound (in use, not ours).
        """
        handler = _handler_class(self)
        try:
            httpd = ThreadingHTTPServer((self._listen.host, self._listen.port), handler)
        except OSError as exc:
            raise ObserveConfigError(
                f"--http {self._listen.host}:{self._listen.port}: {exc.strerror}"
            ) from None
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="ursa-http", daemon=True
        )
        self._thread.start()
        logger.info("dashboard and /metrics on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        callbacks, self._on_stop = self._on_stop, []
        for callback in callbacks:
            callback()
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(5.0)

    def __enter__(self) -> ObserveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- requests (on the server's threads) -----------------------------------

    def authorised(self, headers: Any, query: str) -> bool:
        """Whether a request carries the token (always, without one)."""
        token = self._token
        if token is None:
            return True
        given = ""
        auth = str(headers.get("Authorization", ""))
        if auth.startswith("Bearer "):
            given = auth[len("Bearer ") :].strip()
        if not given:
            given = parse_qs(query).get("token", [""])[0]
        return hmac.compare_digest(given.encode(), token.encode())

    def respond(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) of GET ``path``."""
        if path in _ASSETS:
            name, content_type = _ASSETS[path]
            static = resources.files("ursa.tools.observe").joinpath("static")
            body = static.joinpath(name).read_bytes()
            if name == "dashboard.html" and self._token is not None:
                # the page's own assets need the token too
                query = html.escape("?" + urlencode({"token": self._token}))
                for asset in ("dashboard.js", "dashboard.css"):
                    body = body.replace(
                        f'"{asset}"'.encode(), f'"{asset}{query}"'.encode()
                    )
            return HTTPStatus.OK, content_type, body
        if path == "/api/status":
            document = self._source().to_json()
            body = json.dumps(document, allow_nan=False).encode()
            return HTTPStatus.OK, "application/json", body
        if path == "/metrics":
            if self._metrics is None:
                return (
                    HTTPStatus.NOT_IMPLEMENTED,
                    "text/plain; charset=utf-8",
                    OPS_EXTRA_HINT.encode(),
                )
            return HTTPStatus.OK, self._metrics_type, self._metrics()
        return HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n"


def observe_service(
    service: CoordinatorService, listen: str, *, token: str | None = None
) -> ObserveServer:
    """Serve ``service``'s view on ``listen`` (``HOST:PORT``), started.

    While it serves, the coordinator's warnings and errors are also kept as
    the dashboard's "recent errors".

    Raises:
        ObserveConfigError: a bad address, beyond loopback without a token,
            or a port that cannot be bound.
    """
    server = ObserveServer(
        lambda: service_status(service), parse_listen(listen), token=token
    )
    server.start()
    handler = RecentErrors(service.telemetry)
    coordinator_log = logging.getLogger("ursa.coordinator")
    coordinator_log.addHandler(handler)
    server.on_stop(lambda: coordinator_log.removeHandler(handler))
    return server


def _handler_class(server: ObserveServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ursa"
        sys_version = ""

        def do_GET(self) -> None:
            self._answer(head=False)

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_POST(self) -> None:
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, "text/plain", b"read-only\n")

        do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

        def _answer(self, *, head: bool) -> None:
            parts = urlsplit(self.path)
            if not server.authorised(self.headers, parts.query):
                self._send(
                    HTTPStatus.UNAUTHORIZED,
                    "text/plain; charset=utf-8",
                    b"a token is required (Authorization: Bearer, or ?token=)\n",
                    extra={"WWW-Authenticate": 'Bearer realm="ursa"'},
                )
                return
            try:
                status, content_type, body = server.respond(parts.path)
            except Exception:
                logger.exception("HTTP %s failed", parts.path)
                status, content_type = HTTPStatus.INTERNAL_SERVER_ERROR, "text/plain"
                body = b"internal error (see the coordinator's log)\n"
            self._send(status, content_type, b"" if head else body, length=len(body))

        def _send(
            self,
            status: int,
            content_type: str,
            body: bytes,
            *,
            length: int | None = None,
            extra: dict[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header(
                "Content-Length", str(len(body) if length is None else length)
            )
            for name, value in (_SECURITY_HEADERS | (extra or {})).items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            # the request line may hold ?token=: log the path only, at DEBUG
            logger.debug("HTTP %s %s", self.command, urlsplit(self.path).path)

    return Handler
