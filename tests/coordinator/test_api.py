"""The public API of `ursa.coordinator`, pinned."""

from __future__ import annotations

import ursa.coordinator as coordinator


def test_all_is_pinned_and_every_name_resolves() -> None:
    assert sorted(coordinator.__all__) == [
        "BeforeTraining",
        "ClimbDualStep",
        "CoordinatorConfig",
        "CoordinatorService",
        "DubheSelection",
        "FeddiskPlugin",
        "FeddiskSpec",
        "FlickerMethod",
        "NoTraining",
        "RandomSelection",
        "RoundPlugin",
        "Selection",
        "SelectionContext",
        "SelectionMethod",
        "SelectionRequest",
        "TrainingConfig",
        "TrainingPlugin",
        "load_coordinator_config",
    ]
    for name in coordinator.__all__:
        assert getattr(coordinator, name) is not None
