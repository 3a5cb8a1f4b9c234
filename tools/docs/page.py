"""A generated documentation page's command line: write it to ``--out`` or print it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def write_page(
    render: Callable[[], str], description: str, argv: list[str] | None
) -> int:
    """Parse ``--out``, render the page and write it there (or to stdout)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--out", type=Path, help="write the page here (default: stdout)"
    )
    args = parser.parse_args(argv)
    page = render()
    if args.out is None:
        print(page, end="")
    else:
        args.out.write_text(page, encoding="utf-8")
    return 0
