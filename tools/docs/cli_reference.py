"""The CLI reference page, written from the ``ursa`` command's argparse parser.

Every command and subcommand with its help text, so the page cannot drift
from the code: a test compares the committed page with this module's output.

Run (from a checkout)::

    python -m ursa.tools.docs.cli_reference --out docs/reference/cli.md
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from ursa.tools.cli.app import build_parser
from ursa.tools.docs.page import write_page

COMMAND = "python -m ursa.tools.docs.cli_reference --out docs/reference/cli.md"
WIDTH = "88"  # help text wrapped at a fixed width, whatever the terminal

HEADER = f"""# CLI reference: `ursa`

Generated from the command's parser by `{COMMAND}`
(`tools/docs/cli_reference.py`; a test fails when this page and the parser
differ). `ursa <command> --help` prints the same text.
"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's subcommands by name (none for a leaf command)."""
    for action in parser._actions:  # argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def sections(parser: argparse.ArgumentParser, level: int) -> Iterator[str]:
    """A heading and the help of one command, then of each subcommand."""
    yield f"{'#' * level} `{parser.prog}`"
    yield ""
    yield "```text"
    yield parser.format_help().rstrip()
    yield "```"
    yield ""
    for child in subcommands(parser).values():
        yield from sections(child, min(level + 1, 4))


def render() -> str:
    """The whole page."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        lines = [HEADER, *sections(build_parser(), 2)]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page to ``--out`` (or print it)."""
    return write_page(render, "Write the CLI reference page.", argv)


if __name__ == "__main__":
    raise SystemExit(main())
