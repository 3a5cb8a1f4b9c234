"""Fixtures of the FLICKER tests: fleets of the production method on the bus."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ursa.lab.simulate.flicker_fleet import Fleet, build_fleet

Build = Callable[..., Fleet]


@pytest.fixture
def fleets() -> Iterator[Build]:
    """`build_fleet`, each fleet closed (its store and directory) after the test."""
    built: list[Fleet] = []

    def build(*args: Any, **kwargs: Any) -> Fleet:
        fleet = build_fleet(*args, **kwargs)
        built.append(fleet)
        return fleet

    yield build
    for fleet in built:
        fleet.close()
