"""The HTTP view's fixtures: ``browser``, one headless Chromium per test."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tools.observe.chromium import DevTools


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("chromium is not installed (.ci/setup installs Debian's)")
    devtools = DevTools(binary, tmp_path / "chromium-profile")
    try:
        yield devtools
    finally:
        devtools.close()
