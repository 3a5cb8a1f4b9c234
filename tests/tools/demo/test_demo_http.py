"""`ursa demo --http`: the dashboard's status and metrics while the demo runs."""

from __future__ import annotations

import io
import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ursa.tools.demo.settings import TrainingDemoSettings
from ursa.tools.demo.training import run_training_demo

pytestmark = pytest.mark.integration

TOKEN = "demo-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _read(url: str) -> bytes | None:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, OSError):
        return None


def test_demo_serves_the_dashboard_status_and_metrics_while_it_runs(
    tmp_path: Path,
) -> None:
    pytest.importorskip("amqtt")
    port = _free_port()
    base = f"http://127.0.0.1:{port}/"
    settings = TrainingDemoSettings(
        devices=6, k=2, tries=2, rounds=3, key_bits=512, processes=2,
        local_epochs=1, report_dir=tmp_path / "report", timeout_s=120,
        eval_every=0, weighting="none", http=f"127.0.0.1:{port}", http_token=TOKEN,
    )  # fmt: skip
    seen: list[dict[str, Any]] = []
    metrics: list[str] = []
    pages: list[bytes] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.3):
            body = _read(base + "api/status")
            if body is None:
                continue
            status = json.loads(body)
            if status["rounds"]:
                seen.append(status)
                text = _read(base + "metrics")
                page = _read(base)
                if text is not None and page is not None:
                    metrics.append(text.decode())
                    pages.append(page)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    err = io.StringIO()
    try:
        report = run_training_demo(settings, out=io.StringIO(), err=err)
    finally:
        done.set()
        watcher.join(10)

    assert report["completed"]
    assert f"dashboard, /api/status and /metrics on {base}" in err.getvalue()
    assert seen, "no status with a finished round was read while the demo ran"
    last = seen[-1]
    assert last["methods"] == ["dubhe", "fedavg"]
    for entry in last["rounds"]:
        assert 0 <= entry["l1_to_uniform"] <= 2  # the harness's figure
        assert 0 <= entry["accuracy"] <= 1 and len(entry["per_class_accuracy"]) == 10
    assert "l1_to_uniform" in last["round_figures"]  # said before round 1 too
    # the view outlives the coordinator's loop while the devices save the final
    # model: the finished federation shows its rounds and devices
    finished = [s for s in seen if s["stage"] == "done"]
    assert finished, "no status of the finished federation was read"
    for status in finished:
        assert status["rounds_completed"] == 3 and status["devices"]["enrolled"] == 6
        assert status["link"] in ("up", "closed")  # closed once it stopped; never down
        listed = status["devices"]["list"]
        assert sum(d["selected"] for d in listed) == 3 * 2  # K = 2, 3 rounds
        assert sum(d["trained"] + d["failed"] for d in listed) == 3 * 2
    assert metrics and "ursa_round " in metrics[-1]
    assert 'ursa_accuracy{source="server"}' in metrics[-1]
    assert b'src="dashboard.js"' in pages[-1] and TOKEN.encode() not in pages[-1]
    assert _read(base + "api/status") is None  # the view stopped with the demo
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "http_token" not in written["settings"]
    assert TOKEN not in (tmp_path / "report" / "report.json").read_text()
