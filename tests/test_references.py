"""The repository stands on its own: no doc or docstring points outside it.

The design notes and paper copies ursa started from are not part of the
repository; a reader who is sent to "SPEC §5" or "papers/003" finds
nothing. Papers are cited by name, everything else by its page in docs/.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"SPEC §|papers/0\d\d|DESIGN-methods|shared/SPEC")
SKIPPED = {".venv", ".git", "site", "build", "dist"}


def _texts() -> list[Path]:
    return [
        p
        for p in ROOT.rglob("*")
        if p.suffix in {".py", ".md", ".toml", ".yml"}
        and not SKIPPED & set(p.relative_to(ROOT).parts)
        and p.is_file()
        and p != Path(__file__).resolve()
    ]


def test_no_doc_or_docstring_points_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _texts()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)
