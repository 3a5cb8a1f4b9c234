from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.tools.observe.statuses import fixed_status
from ursa.coordinator.live_status import ServiceStatus
from ursa.coordinator.telemetry import Telemetry
from ursa.tools.observe.server import (
    Listen,
    ObserveConfigError,
    ObserveServer,
    parse_listen,
)

LOOPBACK = Listen("127.0.0.1", 0)


@pytest.fixture
def telemetry() -> Telemetry:
    telemetry = Telemetry()
    telemetry.set_methods(["dubhe", "climb"])
    telemetry.received("d1", "hello")
    telemetry.sent("selection_result")
    telemetry.rejected("unknown_device")
    telemetry.stage_changed("selecting", 1)
    telemetry.round_completed(1, ("d1", "d2"))
    return telemetry


@pytest.fixture
def served(telemetry: Telemetry) -> Iterator[ObserveServer]:
    with ObserveServer(lambda: fixed_status(telemetry), LOOPBACK) as server:
        yield server


def _get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, dict(exc.headers), exc.read()


def test_the_page_and_its_assets_are_served_with_no_external_reference(
    served: ObserveServer,
) -> None:
    status, headers, page = _get(served.url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'src="dashboard.js"' in page and b'href="dashboard.css"' in page
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    for asset in ("dashboard.js", "dashboard.css"):
        status, _, body = _get(served.url + asset)
        assert status == 200 and body
    for body in (page, _get(served.url + "dashboard.js")[2]):
        assert b"http://" not in body and b"https://" not in body


def test_api_status_is_the_status_document(served: ObserveServer) -> None:
    status, headers, body = _get(served.url + "api/status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc["federation"] == "fed" and doc["round"] == 2
    assert doc["devices"]["online"] == 2 and doc["devices"]["enrolled"] == 3
    assert doc["methods"] == ["dubhe", "climb"]
    assert [r["round"] for r in doc["rounds"]] == [1]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_are_prometheus_text_with_the_ursa_families(
    served: ObserveServer,
) -> None:
    status, headers, body = _get(served.url + "metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = _samples(body.decode())
    assert samples[("ursa_round", ())] == 2
    assert samples[("ursa_devices_online", ())] == 2
    assert samples[("ursa_devices_enrolled", ())] == 3
    assert (
        samples[("ursa_messages_total", (("direction", "in"), ("kind", "hello")))] == 1
    )
    assert (
        samples[("ursa_rejected_messages_total", (("reason", "unknown_device"),))] == 1
    )
    assert samples[("ursa_bytes_total", (("direction", "in"),))] == 3000
    assert samples[("ursa_bytes_total", (("direction", "out"),))] == 1000
    assert samples[("ursa_crypto_seconds_total", ())] == 0.5
    assert samples[("ursa_round_duration_seconds_count", ())] == 1
    assert samples[("ursa_updates_total", ())] == 0
    assert samples[("ursa_stage", (("stage", "training"),))] == 1
    assert samples[("ursa_site_link_up", (("site", "site-a"),))] == 1
    assert samples[("ursa_site_link_up", (("site", "site-b"),))] == 0


def test_two_views_in_one_process_keep_their_own_registries(
    telemetry: Telemetry,
) -> None:
    other = Telemetry()
    with (
        ObserveServer(lambda: fixed_status(telemetry, 4), LOOPBACK) as a,
        ObserveServer(lambda: fixed_status(other, 7), LOOPBACK) as b,
    ):
        assert _samples(_get(a.url + "metrics")[2].decode())[("ursa_round", ())] == 4
        assert _samples(_get(b.url + "metrics")[2].decode())[("ursa_round", ())] == 7


def test_beyond_loopback_a_token_is_required(telemetry: Telemetry) -> None:
    with pytest.raises(ObserveConfigError, match="needs a token"):
        ObserveServer(lambda: fixed_status(telemetry), Listen("0.0.0.0", 0))
    with pytest.raises(ObserveConfigError, match="needs a token"):
        ObserveServer(lambda: fixed_status(telemetry), Listen("example.org", 0))


def test_with_a_token_every_request_without_it_gets_401(telemetry: Telemetry) -> None:
    token = "s3cret-token"
    with ObserveServer(
        lambda: fixed_status(telemetry), LOOPBACK, token=token
    ) as server:
        for path in ("", "api/status", "metrics", "dashboard.js", "nowhere"):
            status, headers, body = _get(server.url + path)
            assert status == 401, path
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert token.encode() not in body
        assert _get(server.url + "api/status", Authorization="Bearer wrong")[0] == 401
        bearer = f"Bearer {token}"
        assert _get(server.url + "metrics", Authorization=bearer)[0] == 200
        status, _, page = _get(server.url, Authorization=bearer)
        assert status == 200 and token.encode() not in page
        assert b'src="dashboard.js"' in page


def test_a_token_in_the_query_string_is_refused_even_when_right(
    telemetry: Telemetry,
) -> None:
    token = "s3cret-token"
    with ObserveServer(
        lambda: fixed_status(telemetry), LOOPBACK, token=token
    ) as server:
        for path in (f"?token={token}", f"api/status?token={token}", "metrics?token="):
            status, _, body = _get(server.url + path)
            assert status == 400 and b"/login" in body, path
            assert token.encode() not in body
        bearer = f"Bearer {token}"  # not even with the header beside it
        assert (
            _get(server.url + f"api/status?token={token}", Authorization=bearer)[0]
            == 400
        )


def test_the_view_is_read_only_and_unknown_paths_are_404(
    served: ObserveServer,
) -> None:
    request = urllib.request.Request(served.url + "api/status", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    with caught.value:
        assert caught.value.code == 405
    assert _get(served.url + "admin")[0] == 404


def test_a_failing_source_is_a_500_not_a_dead_server(telemetry: Telemetry) -> None:
    calls: list[int] = []

    def flaky() -> ServiceStatus:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("store gone")
        return fixed_status(telemetry)

    with ObserveServer(flaky, LOOPBACK) as server:
        assert _get(server.url + "api/status")[0] == 500
        assert _get(server.url + "api/status")[0] == 200


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9464", Listen("127.0.0.1", 9464)),
        ("9464", Listen("127.0.0.1", 9464)),
        ("[::1]:9464", Listen("::1", 9464)),
        ("0.0.0.0:80", Listen("0.0.0.0", 80)),
    ],
)
def test_parse_listen(text: str, expected: Listen) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["", "host:", "host:port", "1.2.3.4:70000"])
def test_parse_listen_refuses_nonsense(text: str) -> None:
    with pytest.raises(ObserveConfigError):
        parse_listen(text)


def test_loopback_detection() -> None:
    assert Listen("localhost", 1).is_loopback and Listen("::1", 1).is_loopback
    assert Listen("127.0.0.2", 1).is_loopback
    assert not Listen("192.168.1.10", 1).is_loopback


def test_without_prometheus_client_the_page_works_and_metrics_say_why(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # not installed
    monkeypatch.delitem(sys.modules, "ursa.tools.observe.metrics", raising=False)
    with ObserveServer(lambda: fixed_status(telemetry), LOOPBACK) as server:
        status, _, body = _get(server.url + "metrics")
        assert status == 501 and b"pip install 'ursa-fl[ops]'" in body
        assert _get(server.url + "api/status")[0] == 200
        assert _get(server.url)[0] == 200


def test_the_coordinator_and_its_command_do_not_import_prometheus_client() -> None:
    code = (
        "import sys, ursa.coordinator.service, ursa.tools.cli.app, "
        "ursa.tools.compose; "
        "sys.exit('prometheus_client' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
