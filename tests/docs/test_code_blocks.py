"""The tutorials' and how-to guides' code blocks run as written.

A fenced block says what it is by its info string: ``sh`` (commands: run),
``python`` (a program: run), ``toml`` (a config: parsed), ``text`` (output or a
listing: not run). A command or program that cannot run here (root, a Pi, a
real network, placeholders only the reader can fill in) is marked on the line
before its fence, with the reason::

    <!-- docs-test: skip: needs root (sudo) and devices on your network -->

What runs is one short federation: the first-federation tutorial's commands
in order, as written, from a copy of ``examples/`` (the broker on a free port
instead of 1883, in the commands and the copied configs), with the program of
"Write a device app" as a third device on that page's ``device.toml``. Every
other ``sh`` or ``python`` block must be marked: a new one fails
`test_every_command_and_program_is_run_or_marked` until it is either.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import ursa
from ursa._compat import tomllib

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted([*DOCS.glob("tutorials/*.md"), *DOCS.glob("how-to/*.md")])
KINDS = {"sh": "commands", "python": "a program", "toml": "a config", "text": "output"}
RUNNABLE = {"sh", "python"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_SKIP = re.compile(r"^<!-- docs-test: skip: (?P<reason>.*?) ?-->$")

FEDERATION = "tutorials/first-federation.md"
DEVICE_APP = "how-to/write-a-device-app.md"
RUN: dict[str, set[str]] = {FEDERATION: {"sh"}, DEVICE_APP: {"python"}}
"""What `test_the_first_federation_runs_as_written` runs, page by page."""
FINAL_MODEL = "how-to/use-the-final-model.md"
PROGRAMS: dict[str, set[str]] = {FINAL_MODEL: {"python"}}
"""Pages whose programs run on their own (`test_a_standalone_program_runs`)."""
EXAMPLE = "examples/numpy_softmax"
BROKER_PORT = "1883"
FINISH_S = 240.0
"""How long the federation may take before the run counts as failed."""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: str  # relative to docs/
    line: int  # of the opening fence, 1-based
    kind: str  # the info string
    text: str
    skip: str | None  # the reason, when marked

    def __str__(self) -> str:
        return f"docs/{self.page}:{self.line} ({self.kind or 'no info string'})"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order, with its skip marker if any."""
    lines = page.read_text().splitlines()
    found, start, kind = [], -1, ""
    for number, line in enumerate(lines):
        fence = _FENCE.match(line)
        if fence is None:
            continue
        if start < 0:
            start, kind = number, fence.group(1)
            continue
        before = lines[start - 1].strip() if start else ""
        marker = _SKIP.match(before)
        found.append(
            Block(
                page=page.relative_to(DOCS).as_posix(),
                line=start + 1,
                kind=kind,
                text="\n".join(lines[start + 1 : number]) + "\n",
                skip=marker.group("reason") if marker else None,
            )
        )
        start = -1
    assert start < 0, f"{page}:{start + 1}: a fence is never closed"
    return found


ALL = [block for page in PAGES for block in blocks(page)]


def test_the_pages_have_blocks() -> None:
    assert {b.page for b in ALL} >= set(RUN)
    assert sum(b.kind in RUNNABLE for b in ALL) >= 5


def test_every_block_says_what_it_is() -> None:
    unnamed = [str(b) for b in ALL if b.kind not in KINDS]
    assert not unnamed, f"info string not one of {sorted(KINDS)}: {unnamed}"


def test_every_skip_marker_gives_a_reason_and_marks_a_command() -> None:
    for block in ALL:
        if block.skip is not None:
            assert len(block.skip.split()) >= 3, f"{block}: say why it cannot run"
            assert block.kind in RUNNABLE, f"{block}: only commands and programs skip"
    markers = sum(
        line.startswith("<!-- docs-test:")
        for page in PAGES
        for line in page.read_text().splitlines()
    )
    assert markers == sum(b.skip is not None for b in ALL), (
        "a marker is not above a fence"
    )


def test_every_command_and_program_is_run_or_marked() -> None:
    unrun = [
        str(b)
        for b in ALL
        if b.kind in RUNNABLE
        and b.skip is None
        and b.kind not in RUN.get(b.page, set()) | PROGRAMS.get(b.page, set())
    ]
    assert not unrun, f"run these in this module or mark them skipped: {unrun}"
    run = [b for b in ALL if b.skip is None and b.kind in RUN.get(b.page, ())]
    assert {b.page for b in run} == set(RUN)


@pytest.mark.parametrize(
    "block",
    [b for b in ALL if b.skip is None and b.kind in PROGRAMS.get(b.page, ())],
    ids=str,
)
def test_a_standalone_program_runs(block: Block, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    root = Path(ursa.__path__[0]).parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{block}:\n{done.stderr}"


@pytest.mark.parametrize("block", [b for b in ALL if b.kind == "toml"], ids=str)
def test_toml_blocks_parse(block: Block) -> None:
    tomllib.loads(block.text)


def _the(page: str, kind: str) -> list[Block]:
    return [b for b in ALL if b.page == page and b.kind == kind and b.skip is None]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wrappers(folder: Path, mosquitto: Path) -> Path:
    """``python``, ``ursa`` and ``mosquitto`` as the pages call them, on PATH.

    Both run this interpreter on this checkout's ``ursa`` (the pages set
    ``PYTHONPATH=.``, so the import root is added after it, not instead).
    """
    folder.mkdir()
    root = Path(ursa.__path__[0]).parent
    extra = f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{root}"\n'
    if not (root / "ursa").is_dir():  # an editable install finds ursa itself
        extra = ""
    for name, run in (("python", ""), ("ursa", " -m ursa.tools.cli")):
        script = folder / name
        script.write_text(f'#!/bin/sh\n{extra}exec {sys.executable}{run} "$@"\n')
        script.chmod(0o755)
    (folder / "mosquitto").symlink_to(mosquitto)
    return folder


def _on_port(text: str, port: int) -> str:
    return text.replace(BROKER_PORT, str(port))


def _copy_example(to: Path, port: int) -> Path:
    shutil.copytree(
        ROOT / EXAMPLE,
        to,
        ignore=shutil.ignore_patterns("state", "data", "__pycache__"),
    )
    for config in to.glob("*.toml"):
        config.write_text(_on_port(config.read_text(), port))
    return to


def _start(
    command: list[str], cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """``command`` in its own process group, its output into ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started process groups: all stopped after the test, however it ends."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.integration
@pytest.mark.slow
def test_the_first_federation_runs_as_written(
    tmp_path: Path,
    mosquitto_binary: Path,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    port = _free_port()
    example = _copy_example(tmp_path / "checkout" / EXAMPLE, port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("URSA_")}
    bin_dir = _wrappers(tmp_path / "bin", mosquitto_binary)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"

    # the device app's page: its program and its device.toml, as a third device
    (app,) = _the(DEVICE_APP, "python")
    (config,) = _the(DEVICE_APP, "toml")
    app_dir = _copy_example(tmp_path / "app", port)
    (app_dir / "device.toml").write_text(
        _on_port(config.text, port).replace("dev000", "dev002")
    )
    (app_dir / "device_app.py").write_text(app.text)
    subprocess.run(
        ["python", "softmax_data.py", "data", "--devices", "1"],
        cwd=app_dir,
        env=env,
        check=True,
    )

    commands = "\n".join(_on_port(b.text, port) for b in _the(FEDERATION, "sh"))
    tutorial = _start(
        ["bash", "-c", f"set -e\n{commands}\nwait\n"],
        tmp_path / "checkout",
        env,
        tmp_path / "tutorial.log",
    )
    processes.append(tutorial)
    device = _start(["python", "device_app.py"], app_dir, env, tmp_path / "app.log")
    processes.append(device)

    finals = [example / f"state/dev00{i}/final" for i in (0, 1)]
    coordinator_final = example / "state/coordinator/final/model_card.json"
    deadline = time.monotonic() + FINISH_S
    while time.monotonic() < deadline and tutorial.poll() is None:
        done = coordinator_final.exists() and all(f.is_dir() for f in finals)
        if done and device.poll() is not None:
            break
        time.sleep(0.5)
    output = (tmp_path / "tutorial.log").read_text(errors="replace")
    app_output = (tmp_path / "app.log").read_text(errors="replace")
    assert tutorial.poll() is None, f"a tutorial command failed:\n{output[-3000:]}"
    assert "all 3 rounds complete" in output, output[-3000:]
    assert coordinator_final.exists(), output[-3000:]
    assert [f for f in finals if not f.is_dir()] == [], output[-3000:]
    assert device.poll() == 0, f"the device app did not finish:\n{app_output[-3000:]}"
    assert (app_dir / "state/dev002/final").is_dir(), app_output[-3000:]
