"""Without TenSEAL (Python 3.10 has no 0.3.18 wheel) FLICKER fails when configured.

These tests run on every Python; the 3.10 CI run has no TenSEAL at all, so
there the subprocess test checks the real absence, not a patched one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from ursa.coordinator.method_context import MethodContext
from ursa.coordinator.methods.flicker.method import FlickerMethod
from ursa.coordinator.methods_config import FlickerSpec
from ursa.crypto.ckks import CKKS_UNAVAILABLE, require_tenseal
from ursa.crypto.errors import BackendUnavailableError
from ursa.edge_sdk.method import DeviceContext
from ursa.edge_sdk.methods.flicker.method import Flicker

MESSAGE = "CKKS unavailable: install ursa-fl[ckks] on Python ≥ 3.11"


@pytest.fixture
def no_tenseal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tenseal", None)  # import raises ImportError


@pytest.mark.usefixtures("no_tenseal")
def test_require_tenseal_raises_the_install_instruction() -> None:
    with pytest.raises(BackendUnavailableError) as caught:
        require_tenseal()
    assert str(caught.value) == MESSAGE == CKKS_UNAVAILABLE


@pytest.mark.usefixtures("no_tenseal")
def test_flicker_device_fails_when_constructed() -> None:
    with pytest.raises(BackendUnavailableError, match="CKKS unavailable"):
        Flicker(cast(DeviceContext, object()), labels=np.array([0, 1, 2]))


@pytest.mark.usefixtures("no_tenseal")
def test_flicker_coordinator_fails_when_constructed(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailableError, match="CKKS unavailable"):
        FlickerMethod(
            FlickerSpec(),
            cast(MethodContext, object()),  # never read: TenSEAL is checked first
            num_classes=3,
            state_dir=tmp_path,
        )


def test_flicker_modules_import_without_tenseal() -> None:
    code = (
        "import sys; sys.modules['tenseal'] = None; "
        "import ursa.edge_sdk, ursa.edge_sdk.methods.flicker.participant, "
        "ursa.coordinator, "
        "ursa.coordinator.methods.flicker.session"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.usefixtures("no_tenseal")
def test_a_flicker_config_without_tenseal_is_a_setup_error(tmp_path: Path) -> None:
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.edge_sdk.config import DeviceConfig
    from ursa.tools.compose import ServiceSetupError, build_coordinator, build_device

    methods = [{"kind": "dubhe"}, {"kind": "flicker"}]
    coordinator = CoordinatorConfig.model_validate(
        {"federation": "f", "state_dir": tmp_path / "c", "methods": methods}
    )
    with pytest.raises(ServiceSetupError, match="CKKS unavailable"):
        build_coordinator(coordinator)
    labels = tmp_path / "labels.txt"
    labels.write_text("0 1 1 2")
    device = DeviceConfig.model_validate(
        {"device_id": "d1", "federation": "f", "state_dir": tmp_path / "d"}
        | {"methods": methods}
    )
    with pytest.raises(ServiceSetupError, match="CKKS unavailable"):
        build_device(device, labels)
