"""Commands that run from a checkout of ursa only: the lab's and the benchmarks'.

The ``ursa-fl`` wheel holds the product; ``ursa.lab`` (simulators) and
``ursa.bench`` stay in the repository. From an installed wheel their commands
still parse (any arguments) and then say so in one line, exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # argparse has no public name for the object add_subparsers() returns.
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

CHECKOUT_EXIT = 2
_NO_OPTIONS = "\0"
"""A prefix no argument starts with: the stand-in takes every argument as given."""


def in_checkout(package: str) -> bool:
    """Whether ``package`` (``ursa.lab``, ``ursa.bench``) can be imported here."""
    return importlib.util.find_spec(package) is not None


def checkout_message(command: str, package: str) -> str:
    """The one line a wheel install prints for a checkout-only command."""
    return (
        f"ursa {command} needs a checkout of ursa: {package} is not in the ursa-fl "
        "wheel; clone the repository and run it there "
        "(`pip install -e '.[all]'`, then `ursa "
        f"{command} ...`)"
    )


def add_checkout_only(
    sub: Subparsers, command: str, package: str, summary: str
) -> None:
    """Attach a stand-in for ``ursa <command>`` that prints `checkout_message`."""
    parser = sub.add_parser(
        command, help=f"{summary} (from a checkout)", add_help=False,
        prefix_chars=_NO_OPTIONS,
    )  # fmt: skip
    parser.add_argument("arguments", nargs=argparse.REMAINDER)

    def refuse(_: argparse.Namespace) -> int:
        print(checkout_message(command, package), file=sys.stderr)
        return CHECKOUT_EXIT

    parser.set_defaults(handler=refuse)
