"""`run_until_signalled`: a device app stops cleanly on SIGTERM and SIGINT.

The app runs in a real subprocess (signals reach a process, not a thread):
an `EdgeClient` on an in-memory bus, which a spy on the same bus watches.
Once the device is up, the test signals it; the app must say ``stopping``
and ``stopped``, publish its ``offline`` status and exit 0, where Python's
default SIGTERM would kill it with neither.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

APP = textwrap.dedent(
    """
    import logging, sys
    from pathlib import Path
    import numpy as np
    from ursa.edge_sdk import EdgeClient, run_until_signalled
    from ursa.edge_sdk.config import DeviceConfig
    from ursa.protocol.envelope import decode
    from ursa.protocol.inmemory import InMemoryBus, InMemoryTransport

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    bus = InMemoryBus()
    statuses = []

    def seen(topic, payload):
        statuses.append(decode(payload).state)
        if statuses[-1] == "online":
            print("up", flush=True)  # the handlers are in place: signal it now

    spy = InMemoryTransport(bus, "spy")
    spy.set_handler(seen)
    spy.connect()
    spy.subscribe("ursa/v1/f/dev/+/status")
    config = DeviceConfig(device_id="d0", federation="f", state_dir=Path(sys.argv[1]))
    transport = InMemoryTransport(bus, "d0")
    client = EdgeClient(config, np.arange(10) % 3, transport=transport)
    name = run_until_signalled(client, poll_s=0.05)
    bus.flush()
    print(name, statuses[-1], flush=True)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_device_cleanly(tmp_path: Path, signum: int) -> None:
    script = tmp_path / "app.py"
    script.write_text(APP, encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "d0")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "up"
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    name = signal.Signals(signum).name
    assert process.returncode == 0, err
    assert out.split() == [name, "offline"]
    assert f"d0: stopping ({name})" in err and "d0: stopped" in err
    assert err.index("stopping") < err.index("stopped")
