"""The verdicts of `.ci/check_resolution.py`, offline.

The resolver run itself needs PyPI and runs from `.ci/run`, not from pytest;
here it gets hand-made resolutions so that each of its failure modes is seen.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ursa._compat import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_resolution", ROOT / ".ci" / "check_resolution.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


checker = _load_checker()
BOOKWORM, TRIXIE, JETSON = checker.TARGETS
CLEAN = {"numpy": "numpy-2.3.0-cp311-cp311-manylinux_2_27_aarch64.whl"}


def _resolution(target: object, extra: str, packages: dict[str, str]) -> object:
    environment = target.marker_environment()  # type: ignore[attr-defined]
    return checker.Resolution(target, extra, packages, environment)


def test_a_clean_resolution_has_no_problems() -> None:
    assert checker.problems(_resolution(BOOKWORM, "train", CLEAN)) == []


def test_gpu_packages_are_named() -> None:
    packages = {
        **CLEAN,
        "nvidia-cublas": "nvidia_cublas-13.4-py3-none-manylinux_2_27_aarch64.whl",
        "cuda-bindings": "cuda_bindings-13.5-cp311-cp311-manylinux_2_28_aarch64.whl",
        "triton": "triton-3.9.0-cp311-cp311-manylinux_2_28_aarch64.whl",
    }
    [problem] = checker.problems(_resolution(TRIXIE, "train", packages))
    assert "cuda-bindings, nvidia-cublas, triton" in problem


def test_a_source_distribution_is_named() -> None:
    packages = {**CLEAN, "gmpy2": "gmpy2-2.2.1.tar.gz"}
    [problem] = checker.problems(_resolution(BOOKWORM, "", packages))
    assert "not binary wheels: gmpy2-2.2.1.tar.gz" in problem


def test_tenseal_is_required_from_311_and_refused_on_310() -> None:
    tenseal = {**CLEAN, "tenseal": "tenseal-0.3.18-cp311-cp311-manylinux_2_28.whl"}
    assert checker.problems(_resolution(BOOKWORM, "ckks", tenseal)) == []
    assert checker.problems(_resolution(JETSON, "ckks", CLEAN)) == []
    [missing] = checker.problems(_resolution(BOOKWORM, "ckks", CLEAN))
    [present] = checker.problems(_resolution(JETSON, "all", tenseal))
    assert "tenseal missing" in missing
    assert "tenseal present" in present


def test_markers_evaluated_for_the_host_are_caught() -> None:
    host = {**BOOKWORM.marker_environment(), "platform_machine": "x86_64"}
    resolution = checker.Resolution(BOOKWORM, "train", CLEAN, host)
    [problem] = checker.problems(resolution)
    assert "pip evaluated markers" in problem


def test_pip_failure_is_reported_with_its_message() -> None:
    error = "No matching distribution"
    failed = checker.Resolution(JETSON, "ckks", {}, {}, error=error)
    [problem] = checker.problems(failed)
    assert "[ckks]: pip could not resolve" in problem
    assert "No matching distribution" in problem


def test_platform_tags_cover_the_devices_glibc() -> None:
    tags = BOOKWORM.platform_tags()
    assert {"manylinux_2_36_aarch64", "manylinux_2_17_aarch64"} <= set(tags)
    assert "manylinux_2_37_aarch64" not in tags
    assert BOOKWORM.marker_environment()["python_version"] == "3.11"


def test_every_extra_is_checked() -> None:
    extras = checker.extras_of(ROOT / "pyproject.toml")
    assert extras == list(PYPROJECT["project"]["optional-dependencies"])
    assert {"ckks", "train", "infer", "all"} <= set(extras)
