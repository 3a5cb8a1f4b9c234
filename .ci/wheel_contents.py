"""The ursa-fl wheel holds the product and nothing of the lab.

Why: the lab (``ursa.lab``: simulators, fault injection) and the benchmarks
(``ursa.bench``, with its MQTT connection pool) run from a checkout; a user
who installs ``ursa-fl`` gets the product only. ``pyproject.toml`` leaves them
out of ``packages``; this script reads the built wheel's file list, so a
package added back by mistake, or a lab module that lands in a product folder
under its old name, fails ``.ci/wheel`` (and ``tests/test_wheel.py``). It also
checks that the product's own files are there (the CLI, the dashboard's files,
``py.typed``) and prints the wheel's size and file count::

    python .ci/wheel_contents.py dist/ursa_fl-*.whl
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

LAB_PREFIXES = ("ursa/lab/", "ursa/bench/", "ursa/tests/")
"""Folders of the checkout that must not be in the wheel."""
LAB_MODULES = (
    "ursa/protocol/mqtt_pool.py",
    "ursa/tools/simulate/",
    "ursa/tools/faults/",
)
"""The lab's old places inside product packages."""
PRODUCT_FILES = (
    "ursa/py.typed",
    "ursa/tools/cli/app.py",
    "ursa/tools/demo/run.py",
    "ursa/tools/data/federation.py",
    "ursa/tools/observe/static/dashboard.html",
    "ursa/tools/observe/static/dashboard.js",
    "ursa/tools/observe/static/dashboard.css",
    "ursa/tools/observe/static/login.html",
)
"""Files the product needs from an install (spot checks, one per concern)."""


def lab_files(names: Iterable[str]) -> list[str]:
    """The wheel's files that belong to the lab or the benchmarks."""
    return sorted(n for n in names if n.startswith((*LAB_PREFIXES, *LAB_MODULES)))


def missing_product_files(names: Iterable[str]) -> list[str]:
    """`PRODUCT_FILES` the wheel does not hold."""
    return sorted(set(PRODUCT_FILES) - set(names))


def problems(wheel: Path) -> list[str]:
    """Every lab file in the wheel and every product file missing from it."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    found = [f"lab file in the wheel: {name}" for name in lab_files(names)]
    found += [f"product file missing: {name}" for name in missing_product_files(names)]
    return found


def summary(wheel: Path) -> str:
    """``<name>: <bytes> bytes, <n> files``."""
    with zipfile.ZipFile(wheel) as archive:
        count = len(archive.namelist())
    return f"{wheel.name}: {wheel.stat().st_size:,} bytes, {count} files"


def main(argv: Sequence[str] | None = None) -> int:
    """Check the wheel; exit 1 with every problem listed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="the built ursa-fl wheel")
    args = parser.parse_args(argv)
    found = problems(args.wheel)
    if found:
        print("\n".join(["wheel contents check FAILED:", *found]), file=sys.stderr)
        return 1
    print(f"wheel contents: product only; {summary(args.wheel)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
