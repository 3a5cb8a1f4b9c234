"""The README stays a landing page whose links lead somewhere."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_at_most_200_lines() -> None:
    assert len(README.splitlines()) <= 200, (
        "move the detail into docs/ (mkdocs.yml's nav)"
    )


def test_every_relative_link_of_the_readme_exists() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [t for t in targets if "://" not in t]
    assert relative, "the README links into docs/"
    missing = [t for t in relative if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_two_set_up_commands_are_unchanged() -> None:
    assert "bash .ci/setup && .venv/bin/ursa demo" in README
    assert "bash .ci/run  " in README
