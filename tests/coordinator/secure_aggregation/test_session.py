from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ursa.coordinator.secure_aggregation.config import AggregationConfig
from ursa.coordinator.secure_aggregation.session import SecureAggregation


def test_dp_without_the_accountant_is_a_setup_error_not_a_crash_mid_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dp_accounting.rdp", None)  # import fails

    with pytest.raises(ValueError, match=r"noise_multiplier: .*ursa-fl\[dp\]"):
        SecureAggregation(
            AggregationConfig(noise_multiplier=1.0),
            model="classifier",
            state_dir=tmp_path,
            weighting=lambda: "fedavg",
        )
    # without noise nothing is needed
    SecureAggregation(
        AggregationConfig(),
        model="classifier",
        state_dir=tmp_path,
        weighting=lambda: "fedavg",
    )
