"""The operator's HTTP view: dashboard, ``/api/status`` and ``/metrics``, read-only.

Routes (GET and HEAD; POST only to /login; everything else is 405)::

    /               the dashboard page (static HTML; its script polls /api/status)
    /dashboard.js   the page's script (hand-written, draws on <canvas>)
    /dashboard.css  its style sheet (also the login page's; holds no data)
    /api/status     `ServiceStatus.to_json` of the coordinator now
    /metrics        Prometheus exposition (needs prometheus_client: the ops extra)
    /login          with a token set: the login form (GET) and its answer (POST)

Every asset comes from this package (no CDN, no build step), so the page works
on a field network without internet. The stdlib `ThreadingHTTPServer` serves
in a daemon thread; nothing it does can stop the coordinator (a failing
status read is a 500 and a log line).

Access (`ursa.tools.observe.access`): only expected ``Host`` values are
answered (421 otherwise: DNS rebinding). Loopback by default; binding any
other address needs a token (`ObserveConfigError` otherwise), and once a token
is set every request must carry it, as ``Authorization: Bearer <token>``
(Prometheus' ``authorization`` scrape setting) or as the cookie the login form
sets (a browser); a token in the query string is refused, so it never lands
in a URL, a history or a proxy's log. With a certificate and key the view
serves HTTPS itself; beyond loopback without one, a WARNING says the token
travels in clear.
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ursa.coordinator.live_status import ServiceStatus, service_status
from ursa.coordinator.telemetry import RecentErrors
from ursa.protocol.loopback import is_loopback
from ursa.tools.observe.access import (
    Headers,
    HostCheck,
    ObserveConfigError,
    TlsFiles,
    TokenGate,
    host_name,
    tls_context,
)

if TYPE_CHECKING:
    from ursa.coordinator.service import CoordinatorService

__all__ = [
    "LOGIN_BODY_MAX_BYTES",
    "OPS_EXTRA_HINT",
    "Listen",
    "ObserveConfigError",
    "ObserveServer",
    "Reply",
    "TlsFiles",
    "observe_service",
    "parse_listen",
    "query_token_refusal",
]

logger = logging.getLogger("ursa.observe")

OPS_EXTRA_HINT = "/metrics needs prometheus_client: pip install 'ursa-fl[ops]'"
LOGIN_BODY_MAX_BYTES = 4096
"""A login form longer than this is refused unread (413)."""
REQUEST_TIMEOUT_S = 30.0
"""A connection silent this long (mid-handshake, mid-request) is dropped."""

_ASSETS = {
    "/": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
_PUBLIC = frozenset({"/dashboard.css"})  # the login page's style; no data in it
_TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action {}"
)
_SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": _CSP.format("'none'"),
}
_LOGIN_CSP = {"Content-Security-Policy": _CSP.format("'self'")}
_LOGIN_MESSAGE = b"<!--message-->"
_WRONG_TOKEN = b'<p class="login-error" role="alert">That token is not right.</p>'
_BEARER = {"WWW-Authenticate": 'Bearer realm="ursa"'}


@dataclass(frozen=True)
class Reply:
    """One HTTP answer: status, content type, body and extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Listen:
    """Where the HTTP view listens."""

    host: str
    port: int

    @property
    def is_loopback(self) -> bool:
        """True for 127.0.0.0/8, ::1 and ``localhost`` (a name may resolve anywhere)."""
        return is_loopback(self.host)


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


def query_token_refusal(target: str) -> Reply | None:
    """A 400 for a request whose URL holds a ``token`` (right or not), else None.

    A token in a URL lands in the history, a ``Referer`` and proxies' logs:
    it is refused before it is looked at, so no one learns to send it so.
    """
    if "token" not in parse_qs(urlsplit(target).query, keep_blank_values=True):
        return None
    return Reply(
        HTTPStatus.BAD_REQUEST,
        _TEXT,
        b"the token does not go in URLs: sign in at /login, "
        b"or send Authorization: Bearer\n",
    )


def _static(name: str) -> bytes:
    return (
        resources.files("ursa.tools.observe")
        .joinpath("static")
        .joinpath(name)
        .read_bytes()
    )


class ObserveServer:
    """The HTTP view of one coordinator, served from a daemon thread.

    Args:
        source: Returns the coordinator's status now (any thread).
        listen: Address and port (port 0: any free one; see `port`).
        token: Required on every request when set; needed off loopback.
        allowed_hosts: Names it is reached by besides IP literals,
            ``localhost`` and ``listen.host`` (a reverse proxy's, a DNS name).
        tls: Certificate and key: serve HTTPS.

    Raises:
        ObserveConfigError: a non-loopback address without a token, an
            allowed host that is no host name, or TLS files that do not load.
    """

    def __init__(
        self,
        source: Callable[[], ServiceStatus],
        listen: Listen,
        *,
        token: str | None = None,
        allowed_hosts: tuple[str, ...] = (),
        tls: TlsFiles | None = None,
    ) -> None:
        if not listen.is_loopback and not token:
            raise ObserveConfigError(
                f"--http {listen.host}: binding beyond loopback needs a token "
                "(--http-token, or [http] token / URSA_HTTP__TOKEN)"
            )
        self._source = source
        self._listen = listen
        self._hosts = HostCheck(listen.host, allowed_hosts)
        self._gate = TokenGate(token) if token else None
        self._tls = tls_context(tls) if tls is not None else None
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
    def tls(self) -> bool:
        """Whether it serves HTTPS."""
        return self._tls is not None

    @property
    def url(self) -> str:
        """The dashboard's URL (it never holds the token)."""
        host = self._listen.host
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port}/"

    def start(self) -> ObserveServer:
        """Bind and serve in a daemon thread.

        Raises:
            ObserveConfigError: the address cannot be bound (in use, not ours).
        """
        handler = _handler_class(self)
        try:
            httpd = _Server((self._listen.host, self._listen.port), handler, self._tls)
        except OSError as exc:
            raise ObserveConfigError(
                f"--http {self._listen.host}:{self._listen.port}: {exc.strerror}"
            ) from None
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="ursa-http", daemon=True
        )
        self._thread.start()
        logger.info("dashboard and /metrics on %s", self.url)
        if not self._listen.is_loopback and not self.tls:
            logger.warning(
                "the HTTP view on %s has no TLS: its token and the status travel "
                "in clear (--http-tls CERT KEY, or TLS at a reverse proxy)",
                self.url,
            )
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

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request's ``Host`` header is one this view answers."""
        return self._hosts.allows(host)

    def get(self, target: str, headers: Headers) -> Reply:
        """The answer to GET ``target`` (path and query) with ``headers``."""
        refused = query_token_refusal(target)
        if refused is not None:
            return refused
        path = urlsplit(target).path
        gate = self._gate
        if path == "/login":
            if gate is None:
                return Reply(HTTPStatus.SEE_OTHER, _TEXT, b"", {"Location": "./"})
            return self._login_page(HTTPStatus.OK)
        if gate is not None and path not in _PUBLIC and not gate.admits(headers):
            if path == "/":
                return self._login_page(HTTPStatus.UNAUTHORIZED)
            return Reply(
                HTTPStatus.UNAUTHORIZED,
                _TEXT,
                b"a token is required (Authorization: Bearer, or sign in at /login)\n",
                _BEARER,
            )
        return self._respond(path)

    def login(self, form: bytes, *, secure: bool, client: str) -> Reply:
        """The answer to POST /login with ``form`` (url-encoded ``token=``).

        A right token sets the session cookie (``Secure`` when ``secure``)
        and sends the browser to the dashboard; a wrong one is a 401 and a
        log line naming ``client``, never what was typed.
        """
        gate = self._gate
        if gate is None:
            return Reply(HTTPStatus.NOT_FOUND, _TEXT, b"no token is set: no login\n")
        if not gate.login(form):
            logger.warning("HTTP view: a wrong token at /login from %s", client)
            return self._login_page(HTTPStatus.UNAUTHORIZED, _WRONG_TOKEN)
        headers = {"Location": "./", "Set-Cookie": gate.set_cookie(secure=secure)}
        return Reply(HTTPStatus.SEE_OTHER, _TEXT, b"", headers)

    def _login_page(self, status: int, message: bytes = b"") -> Reply:
        body = _static("login.html").replace(_LOGIN_MESSAGE, message)
        return Reply(status, _HTML, body, _LOGIN_CSP | _BEARER)

    def _respond(self, path: str) -> Reply:
        """The answer to GET ``path``, once the request was admitted."""
        if path in _ASSETS:
            name, content_type = _ASSETS[path]
            return Reply(HTTPStatus.OK, content_type, _static(name))
        if path == "/api/status":
            document = self._source().to_json()
            body = json.dumps(document, allow_nan=False).encode()
            return Reply(HTTPStatus.OK, "application/json", body)
        if path == "/metrics":
            if self._metrics is None:
                return Reply(HTTPStatus.NOT_IMPLEMENTED, _TEXT, OPS_EXTRA_HINT.encode())
            return Reply(HTTPStatus.OK, self._metrics_type, self._metrics())
        return Reply(HTTPStatus.NOT_FOUND, _TEXT, b"not found\n")


def observe_service(
    service: CoordinatorService,
    listen: str,
    *,
    token: str | None = None,
    allowed_hosts: tuple[str, ...] = (),
    tls: TlsFiles | None = None,
) -> ObserveServer:
    """Serve ``service``'s view on ``listen`` (``HOST:PORT``), started.

    While it serves, the coordinator's warnings and errors are also kept as
    the dashboard's "recent errors".

    Raises:
        ObserveConfigError: a bad address, beyond loopback without a token,
            a bad allowed host, TLS files that do not load, or a port that
            cannot be bound.
    """
    server = ObserveServer(
        lambda: service_status(service),
        parse_listen(listen),
        token=token,
        allowed_hosts=allowed_hosts,
        tls=tls,
    )
    server.start()
    handler = RecentErrors(service.telemetry)
    coordinator_log = logging.getLogger("ursa.coordinator")
    coordinator_log.addHandler(handler)
    server.on_stop(lambda: coordinator_log.removeHandler(handler))
    return server


class _Server(ThreadingHTTPServer):
    """Wraps each accepted socket in TLS without a handshake yet.

    The handshake runs in the request's own thread (`_handler_class`), so a
    client that stalls it holds one thread until the timeout, not the accept
    loop.
    """

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        tls: ssl.SSLContext | None,
    ) -> None:
        self._tls = tls
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self._tls is not None:
            sock = self._tls.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a failed handshake, a dropped connection: the client's business
        logger.debug(
            "HTTP connection from %s: %r", client_address[0], sys.exc_info()[1]
        )


def _handler_class(server: ObserveServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ursa"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S

        def setup(self) -> None:
            self.request.settimeout(self.timeout)
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()
            super().setup()

        def do_GET(self) -> None:
            self._answer(head=False)

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_POST(self) -> None:
            if not self._host_ok():
                return
            if urlsplit(self.path).path != "/login":
                self._send(Reply(HTTPStatus.METHOD_NOT_ALLOWED, _TEXT, b"read-only\n"))
                return
            refused = query_token_refusal(self.path)
            if refused is not None:
                self.close_connection = True  # the form stays unread
                self._send(refused)
                return
            form = self._form()
            if form is not None:
                self._send(
                    server.login(form, secure=self._secure(), client=self._client())
                )

        def do_PUT(self) -> None:
            if self._host_ok():
                self._send(Reply(HTTPStatus.METHOD_NOT_ALLOWED, _TEXT, b"read-only\n"))

        do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = do_PUT  # noqa: N815

        def _host_ok(self) -> bool:
            host = self.headers.get("Host")
            if server.host_allowed(host):
                return True
            name = host_name(host or "")  # [a-z0-9.-] or an IP, or None
            logger.warning(
                "HTTP view: refused a request for Host %s from %s (a name it is "
                "served by goes in [http] allowed_hosts)",
                repr(name[:80]) if name else "(missing or malformed)",
                self._client(),
            )
            self._send(
                Reply(HTTPStatus.MISDIRECTED_REQUEST, _TEXT, b"unexpected Host\n")
            )
            return False

        def _form(self) -> bytes | None:
            """The login body, or None once a refusal was sent."""
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self._send(
                    Reply(HTTPStatus.LENGTH_REQUIRED, _TEXT, b"length required\n")
                )
                return None
            if int(length) > LOGIN_BODY_MAX_BYTES:
                self.close_connection = True  # the body stays unread
                self._send(
                    Reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, _TEXT, b"too large\n")
                )
                return None
            return self.rfile.read(int(length))

        def _secure(self) -> bool:
            # over TLS, or behind a proxy that did TLS (a lie only makes the
            # cookie stricter: a browser then keeps it off plain HTTP)
            forwarded = self.headers.get("X-Forwarded-Proto", "")
            return server.tls or forwarded.strip().lower() == "https"

        def _client(self) -> str:
            return str(self.client_address[0])

        def _answer(self, *, head: bool) -> None:
            if not self._host_ok():
                return
            try:
                reply = server.get(self.path, self.headers)
            except Exception:
                logger.exception("HTTP %s failed", urlsplit(self.path).path)
                reply = Reply(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    _TEXT,
                    b"internal error (see the coordinator's log)\n",
                )
            self._send(reply, head=head)

        def _send(self, reply: Reply, *, head: bool = False) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in (_SECURITY_HEADERS | dict(reply.headers)).items():
                self.send_header(name, value)
            self.end_headers()
            if reply.body and not head:
                self.wfile.write(reply.body)

        def log_message(self, format: str, *args: Any) -> None:
            # the request line is the client's text: log the path only, at DEBUG
            logger.debug("HTTP %s %s", self.command, urlsplit(self.path).path)

    return Handler
