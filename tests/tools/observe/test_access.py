"""The HTTP view's access: Host check, login cookie, Bearer, no token in URLs."""

from __future__ import annotations

import http.client
import ipaddress
import logging
from collections.abc import Iterator

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.tools.observe.statuses import fixed_status
from ursa.tools.observe.access import (
    COOKIE_NAME,
    HostCheck,
    ObserveConfigError,
    TokenGate,
    host_name,
    session_cookie,
)
from ursa.tools.observe.server import LOGIN_BODY_MAX_BYTES, Listen, ObserveServer

TOKEN = "s3cret-token-0123456789"
ALLOWED = ("dash.example.org",)
NAMES = HostCheck("127.0.0.1", ALLOWED)
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


# --- the Host check, pure ------------------------------------------------------

_ports = st.one_of(st.just(""), st.integers(0, 65535).map(lambda p: f":{p}"))


@given(st.ip_addresses(), _ports)
def test_every_ip_literal_is_answered_with_any_port(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: str
) -> None:
    text = f"[{address}]" if address.version == 6 else str(address)
    assert NAMES.allows(text + port)


@given(
    st.sampled_from(["localhost", "127.0.0.1", *ALLOWED]),
    _ports,
    st.booleans(),
    st.lists(st.booleans(), min_size=20, max_size=20),
)
def test_expected_names_are_answered_in_any_case_with_any_port(
    name: str, port: str, final_dot: bool, upper: list[bool]
) -> None:
    cased = "".join(c.upper() if up else c for c, up in zip(name, upper, strict=False))
    assert NAMES.allows(cased + ("." if final_dot else "") + port)


_labels = st.from_regex(r"[a-z][a-z0-9-]{0,12}[a-z0-9]", fullmatch=True)


@given(st.lists(_labels, min_size=1, max_size=4), _ports)
def test_any_other_name_is_refused(labels: list[str], port: str) -> None:
    name = ".".join(labels)
    assume(name not in NAMES.names)
    assert not NAMES.allows(name + port)


@given(st.text(max_size=40))
def test_whatever_passes_is_an_ip_literal_or_an_expected_name(text: str) -> None:
    if NAMES.allows(text):
        name = host_name(text)
        assert name is not None
        try:
            ipaddress.ip_address(name)
        except ValueError:
            assert name in NAMES.names


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "dash.example.org.evil.example",
        "127.0.0.1:80@evil.example",
        "127.0.0.1:http",
        "[::1",
        "[dash.example.org]",
        "localhost:80:80",
    ],
)
def test_rebinding_names_and_malformed_hosts_are_refused(header: str | None) -> None:
    assert not NAMES.allows(header)


def test_a_named_listen_host_is_answered() -> None:
    assert HostCheck("Coordinator.Lan").allows("coordinator.lan:9464")


@pytest.mark.parametrize(
    "name", ["dash.example.org:443", "https://dash.example.org", "a b", ""]
)
def test_an_allowed_host_that_is_no_host_name_is_a_config_error(name: str) -> None:
    with pytest.raises(ObserveConfigError, match="allowed_hosts"):
        HostCheck("127.0.0.1", [name])


# --- the token gate, pure ------------------------------------------------------


def test_the_cookie_is_derived_from_the_token_and_flagged() -> None:
    gate = TokenGate(TOKEN)
    cookie = gate.set_cookie(secure=False)
    value = session_cookie(cookie.split(";")[0])
    assert value and TOKEN not in cookie and len(value) == 64
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(cookie.split("; "))
    assert "Secure" not in cookie and gate.set_cookie(secure=True).endswith("; Secure")
    assert value != session_cookie(TokenGate("other").set_cookie(secure=False))
    assert TOKEN not in repr(gate)


def test_the_gate_admits_the_bearer_or_its_cookie_and_nothing_else() -> None:
    gate = TokenGate(TOKEN)
    cookie = gate.set_cookie(secure=False).split(";")[0]
    other = TokenGate("other").set_cookie(secure=False).split(";")[0]
    assert gate.admits({"Authorization": f"Bearer {TOKEN}"})
    assert gate.admits({"Cookie": f"theme=dark; {cookie}"})
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Cookie": other},
        {"Cookie": f"{COOKIE_NAME}={TOKEN}"},  # the token itself is no cookie
    ):
        assert not gate.admits(headers), headers


@pytest.mark.parametrize(
    ("form", "right"),
    [
        (f"token={TOKEN}".encode(), True),
        (f"other=1&token={TOKEN}".encode(), True),
        (b"token=wrong", False),
        (f"token={TOKEN}&token={TOKEN}".encode(), False),
        (b"", False),
        (b"token=\xff", False),
    ],
)
def test_the_login_form(form: bytes, right: bool) -> None:
    assert TokenGate(TOKEN).login(form) is right


# --- served ---------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[ObserveServer]:
    view = ObserveServer(
        fixed_status, Listen("127.0.0.1", 0), token=TOKEN, allowed_hosts=ALLOWED
    )
    with view:
        yield view


def _call(
    view: ObserveServer,
    method: str,
    path: str,
    *,
    host: str | None = "127.0.0.1",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request as sent (no redirect followed; ``host=None``: no Host)."""
    connection = http.client.HTTPConnection("127.0.0.1", view.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            connection.putheader("Host", host)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def _login(
    view: ObserveServer,
    token: str,
    *,
    host: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """POST the login form as a browser does."""
    body = f"token={token}".encode()
    return _call(
        view, "POST", "/login", host=host, body=body, headers=FORM | (headers or {})
    )


def test_an_unexpected_or_missing_host_gets_421_whatever_the_request(
    served: ObserveServer, caplog: pytest.LogCaptureFixture
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with caplog.at_level(logging.WARNING, "ursa.observe"):
        for host in ("evil.example", "evil.example:9464", None):
            status, _, body = _call(
                served, "GET", "/api/status", host=host, headers=bearer
            )
            assert status == 421 and body == b"unexpected Host\n", host
        status, _, _ = _login(served, TOKEN, host="evil.example")
        assert status == 421
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 4 and "allowed_hosts" in refusals[0]
    assert [m.count("'evil.example'") for m in refusals] == [1, 1, 0, 1]
    assert "Host (missing or malformed)" in refusals[2]
    for host in ("localhost:1", "dash.example.org", "[::1]:80", "10.0.0.9"):
        assert _call(served, "GET", "/api/status", host=host, headers=bearer)[0] == 200


def test_a_browser_signs_in_once_and_then_reads_with_the_cookie(
    served: ObserveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "ursa.observe")
    status, headers, page = _call(served, "GET", "/")
    assert status == 401 and b'type="password"' in page and b'action="login"' in page
    assert "form-action 'self'" in headers["Content-Security-Policy"]
    assert _call(served, "GET", "/login")[0] == 200
    assert _call(served, "GET", "/dashboard.css")[0] == 200  # the login page's style

    status, headers, page = _login(served, "wrong")
    assert status == 401 and b"not right" in page and "Set-Cookie" not in headers
    assert any("wrong token" in r.getMessage() for r in caplog.records)

    status, headers, _ = _login(served, TOKEN)
    assert status == 303 and headers["Location"] == "./"
    set_cookie = headers["Set-Cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    assert "Path=/" in set_cookie and "Secure" not in set_cookie  # plain HTTP
    assert TOKEN not in set_cookie
    cookie = {"Cookie": set_cookie.split(";")[0]}

    status, headers, page = _call(served, "GET", "/", headers=cookie)
    assert (
        status == 200 and b'src="dashboard.js"' in page and TOKEN.encode() not in page
    )
    assert "form-action 'none'" in headers["Content-Security-Policy"]
    script = _call(served, "GET", "/dashboard.js", headers=cookie)[2]
    assert b"location.search" not in script and b"Authorization" not in script
    assert _call(served, "GET", "/api/status", headers=cookie)[0] == 200
    assert _call(served, "GET", "/metrics", headers=cookie)[0] == 200
    assert _call(served, "GET", f"/api/status?token={TOKEN}", headers=cookie)[0] == 400
    right = f"token={TOKEN}".encode()
    status, headers, _ = _call(
        served, "POST", f"/login?token={TOKEN}", body=right, headers=FORM
    )
    assert status == 400 and "Set-Cookie" not in headers  # the right form, too
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_behind_a_tls_proxy_the_cookie_is_secure(served: ObserveServer) -> None:
    status, answer, _ = _login(served, TOKEN, headers={"X-Forwarded-Proto": "https"})
    assert status == 303 and answer["Set-Cookie"].endswith("; Secure")


def test_post_goes_only_to_login_and_its_body_is_capped(served: ObserveServer) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        assert _call(served, method, "/api/status", headers=bearer, body=b"")[0] == 405
    big = b"token=" + b"x" * LOGIN_BODY_MAX_BYTES
    assert _call(served, "POST", "/login", body=big)[0] == 413
    assert _call(served, "POST", "/login")[0] == 411  # no Content-Length


def test_without_a_token_there_is_no_login() -> None:
    with ObserveServer(fixed_status, Listen("127.0.0.1", 0)) as view:
        status, headers, _ = _call(view, "GET", "/login")
        assert status == 303 and headers["Location"] == "./"
        assert _login(view, "x")[0] == 404
        assert _call(view, "GET", "/api/status")[0] == 200
