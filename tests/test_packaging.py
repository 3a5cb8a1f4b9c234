"""pyproject lists every package folder, so the wheel holds every module."""

from __future__ import annotations

from pathlib import Path

from ursa._compat import tomllib

ROOT = Path(__file__).resolve().parents[1]
NOT_INSTALLED = {"tests", "build"}  # and every dot-folder: .venv, .venv310, ...


def test_every_package_folder_is_in_the_packages_list() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(("ursa", *init.parent.relative_to(ROOT).parts))
        for top in ROOT.iterdir()
        if top.is_dir()
        and not top.name.startswith(".")
        and top.name not in NOT_INSTALLED
        for init in top.rglob("__init__.py")
    } | {"ursa"}
    assert listed == folders
