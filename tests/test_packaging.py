"""pyproject lists every product package, so the wheel holds every product module.

The lab (``lab/``) and the benchmarks (``bench/``) are package folders too, and
the only ones left out: they run from a checkout (tests/test_wheel.py checks
the built wheel itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ursa._compat import tomllib

ROOT = Path(__file__).resolve().parents[1]
NOT_INSTALLED = {"tests", "build"}  # and every dot-folder: .venv, .venv310, ...
CHECKOUT_ONLY = {"lab", "bench"}


def _config() -> Any:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_product_package_folder_is_in_the_packages_list() -> None:
    config = _config()
    listed = set(config["packages"])
    folders = {
        ".".join(("ursa", *init.parent.relative_to(ROOT).parts))
        for top in ROOT.iterdir()
        if top.is_dir()
        and not top.name.startswith(".")
        and top.name not in NOT_INSTALLED | CHECKOUT_ONLY
        for init in top.rglob("__init__.py")
    } | {"ursa"}
    data_only = {name for name in config["package-data"] if name != "*"}
    assert listed == folders | data_only


def test_the_lab_and_the_benchmarks_are_package_folders_left_out() -> None:
    listed = set(_config()["packages"])
    for top in CHECKOUT_ONLY:
        assert (ROOT / top / "__init__.py").is_file()
        assert not {p for p in listed if p.split(".")[1:2] == [top]}


def test_data_only_packages_hold_their_files_and_no_module() -> None:
    for name in _config()["package-data"]:
        if name == "*":
            continue
        folder = ROOT.joinpath(*name.split(".")[1:])
        assert not (folder / "__init__.py").exists(), name
        assert sorted(p.name for p in folder.iterdir() if p.suffix != ".py"), name
