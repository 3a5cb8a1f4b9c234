"""The demo's device processes start from one parent that imported torch and the SDK."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from ursa.tools.demo.devices import device_context

WARM = ("torch", "ursa.edge_sdk.client", "ursa.tools.compose")


def _imported_at_start(queue: Any) -> None:
    queue.put([name for name in WARM if name in sys.modules])


def test_a_device_process_starts_with_torch_and_the_sdk_already_imported() -> None:
    pytest.importorskip("torch")
    context = device_context()
    if context.get_start_method() != "forkserver":
        pytest.skip("no forkserver on this platform: the processes are spawned")
    queue = context.Queue()
    process = context.Process(target=_imported_at_start, args=(queue,))
    process.start()
    try:
        found = queue.get(timeout=300)
    finally:
        process.join(60)

    assert found == list(WARM)  # a spawned process would have none of them
