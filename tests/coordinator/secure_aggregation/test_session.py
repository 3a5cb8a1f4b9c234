from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import pytest

from ursa.coordinator.before_training import StepContext
from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.secure_aggregation.session import SecureAggregation

CTX = cast(StepContext, None)
"""The setup check runs before the step reads its context."""


def test_dp_without_the_accountant_is_a_setup_error_not_a_crash_mid_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dp_accounting.rdp", None)  # import fails

    with pytest.raises(ValueError, match=r"noise_multiplier: .*ursa-fl\[dp\]"):
        SecureAggregation(
            CTX,
            AggregationConfig(noise_multiplier=1.0),
            model="classifier",
            state_dir=tmp_path,
            weighting=lambda: "fedavg",
        )
    # without noise nothing is needed
    SecureAggregation(
        CTX,
        AggregationConfig(),
        model="classifier",
        state_dir=tmp_path,
        weighting=lambda: "fedavg",
    )
