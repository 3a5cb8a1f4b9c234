"""The committed CLI reference is the generator's output."""

import sys
from pathlib import Path

import pytest

from ursa.tools.docs.cli_reference import COMMAND, main, render

PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference" / "cli.md"

# argparse's help layout changed in 3.13 ("-o, --opt O"); the page is written on 3.11.
written_on_311 = pytest.mark.skipif(
    sys.version_info[:2] != (3, 11),
    reason="the page is written by Python 3.11's argparse",
)


@written_on_311
def test_committed_page_matches_the_parser() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"docs/reference/cli.md is stale: regenerate it with `{COMMAND}` (Python 3.11)"
    )


def test_every_command_has_a_section() -> None:
    page = render()
    for command in (
        "ursa coordinator serve",
        "ursa device run",
        "ursa demo",
        "ursa doctor",
    ):
        assert f"`{command}`" in page


def test_out_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "cli.md"
    assert main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render()
