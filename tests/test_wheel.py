"""The built wheel holds the product and no lab module, and its CLI says so.

The wheel is built once (``python -m build --wheel --no-isolation``, as
``.ci/wheel`` builds it, from a copy of the tree so the checkout gets no
``build/`` or ``*.egg-info``), its file list checked by ``.ci/wheel_contents.py``,
and its files unpacked into a folder that Python imports ``ursa`` from instead
of the checkout: there ``ursa simulate`` and ``ursa bench`` refuse in one line,
and the demo deals its devices' data without the lab.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_COPIED = (
    "tests",
    "build",
    "dist",
    "site",
    "ursa-report",
    "*.egg-info",
    "__pycache__",
)


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "wheel_contents", ROOT / ".ci" / "wheel_contents.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


BUILD = (sys.executable, "-m", "build", "--wheel", "--no-isolation")
"""As `.ci/wheel` builds (there through the sdist), without a fresh environment."""


def _not_copied(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n.startswith(".")} | set(
        shutil.ignore_patterns(*NOT_COPIED)(folder, names)
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=_not_copied)
    done = subprocess.run(
        [*BUILD, "--outdir", str(work / "dist"), str(source)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "is absent from the `packages` configuration" not in done.stdout + done.stderr
    )
    (built,) = (work / "dist").glob("ursa_fl-*.whl")
    return built


def test_the_wheel_holds_the_product_and_no_lab_file(wheel: Path) -> None:
    assert checker.problems(wheel) == []
    with zipfile.ZipFile(wheel) as archive:
        tops = {n.split("/")[1] for n in archive.namelist() if n.startswith("ursa/")}
    assert {"crypto", "protocol", "models", "edge_sdk", "coordinator", "tools"} <= tops
    assert not tops & {"lab", "bench"}


def test_the_checker_finds_lab_files_and_missing_product_files() -> None:
    names = [*checker.PRODUCT_FILES, "ursa/lab/simulate/selection.py"]
    names += ["ursa/bench/protocol.py", "ursa/protocol/mqtt_pool.py"]
    assert checker.lab_files(names) == [
        "ursa/bench/protocol.py",
        "ursa/lab/simulate/selection.py",
        "ursa/protocol/mqtt_pool.py",
    ]
    assert checker.missing_product_files(names[1:]) == [checker.PRODUCT_FILES[0]]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's files unpacked, as pip would put a pure wheel in site-packages."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


# Python as on an install of the wheel alone: the checkout's editable install
# (a finder on sys.meta_path that maps ``ursa.*`` to the checkout) is taken out.
_AS_INSTALLED = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in repr(f)]
"""
_URSA = """import runpy
sys.argv[0] = "ursa"
runpy.run_module("ursa.tools.cli", run_name="__main__")
"""


def _python(site: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _AS_INSTALLED + code, *args],
        capture_output=True,
        text=True,
        cwd=site,
        env={**os.environ, "PYTHONPATH": str(site)},
    )


def _ursa(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _python(site, _URSA, *args)


def test_the_installed_package_is_the_wheels(installed: Path) -> None:
    done = _ursa(installed, "--version")
    assert done.returncode == 0, done.stderr
    where = _python(installed, "import ursa.tools.cli as m; print(m.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stderr


def test_the_demo_deals_its_data_from_the_wheel(installed: Path) -> None:
    code = """
from ursa.tools.demo.population import demo_population
from ursa.tools.demo.settings import TrainingDemoSettings
import ursa.tools.demo.run, ursa.tools.demo.selection
federation = demo_population(TrainingDemoSettings(devices=8))
print(len(federation.devices), sorted(m for m in sys.modules if ".lab" in m))
"""
    done = _python(installed, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["8", "[]"]


@pytest.mark.parametrize(
    ("args", "package"),
    [
        (("simulate", "selection", "--k", "3", "--json"), "ursa.lab"),
        (("simulate", "--help"), "ursa.lab"),
        (("bench", "crypto", "--json"), "ursa.bench"),
    ],
)
def test_lab_commands_from_the_wheel_say_they_need_a_checkout(
    installed: Path, args: tuple[str, ...], package: str
) -> None:
    done = _ursa(installed, *args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [checker_message(args[0], package)], done.stderr


def checker_message(command: str, package: str) -> str:
    from ursa.tools.cli.checkout import checkout_message

    return checkout_message(command, package)
