"""Resolve ursa-fl and each of its extras for the device platforms, without installing.

Why: from PyPI, torch >= 2.11 on Linux aarch64 depends on ~3 GB of CUDA 13
packages that cannot run on a Raspberry Pi, and TenSEAL has aarch64 wheels only
from 0.3.18 on (none for Python 3.10). The markers in pyproject.toml steer
around both; this script proves it with pip's own resolver: for each target
platform and extra, ``pip install --dry-run --report`` with
``--platform/--python-version/--only-binary=:all:`` must succeed with binary
wheels only, and pull no ``nvidia-*``, ``cuda-*`` or ``triton`` package.

pip applies ``--platform`` and ``--python-version`` to wheel tags but evaluates
environment markers against the interpreter running it (pypa/pip#11664), so a
plain dry run on an x86_64 host would skip our aarch64 markers and prove
nothing. pip therefore runs through a small shim that sets the target's marker
environment; the report's ``environment`` field is checked to show it took.

Needs PyPI (pip configuration files and ``PIP_*`` index settings are ignored, so
local wheel folders do not hide what users get). ``.ci/run`` calls it after
building the wheel::

    python .ci/check_resolution.py dist/ursa_fl-*.whl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - CI runs this on 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_PREFIXES = ("nvidia-", "cuda-", "triton")
"""Normalized names of GPU-only packages that must never reach a device."""
PIP_ENV_KEPT = ("PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_CACHE_DIR")

# Runs pip with the target's marker environment (see the module docstring).
_PIP_SHIM = """
import json, sys
import pip._vendor.packaging.markers as markers
target = json.loads(sys.argv.pop(1))
host = markers.default_environment
markers.default_environment = lambda: {**host(), **target}
from pip._internal.cli.main import main
sys.exit(main())
"""


@dataclass(frozen=True)
class Target:
    """A device platform: its Python (as the distribution ships it) and glibc."""

    name: str
    python_full_version: str
    glibc_minor: int
    machine: str = "aarch64"

    @property
    def python_version(self) -> str:
        """``3.11`` for ``3.11.2``."""
        return ".".join(self.python_full_version.split(".")[:2])

    def platform_tags(self) -> list[str]:
        """Every manylinux tag this glibc runs (old pips do not expand them)."""
        tags = [
            f"manylinux_2_{minor}_{self.machine}"
            for minor in range(17, 1 + self.glibc_minor)
        ]
        return [*reversed(tags), f"manylinux2014_{self.machine}"]

    def marker_environment(self) -> dict[str, str]:
        """PEP 508 marker values on the device."""
        return {
            "implementation_name": "cpython",
            "implementation_version": self.python_full_version,
            "os_name": "posix",
            "platform_machine": self.machine,
            "platform_python_implementation": "CPython",
            "platform_system": "Linux",
            "python_full_version": self.python_full_version,
            "python_version": self.python_version,
            "sys_platform": "linux",
        }


TARGETS = (
    Target("Raspberry Pi OS bookworm, cp311 aarch64", "3.11.2", glibc_minor=36),
    Target("Raspberry Pi OS trixie, cp313 aarch64", "3.13.5", glibc_minor=41),
    Target("Jetson JetPack 6 (Ubuntu 22.04), cp310 aarch64", "3.10.12", glibc_minor=35),
)


@dataclass(frozen=True)
class Resolution:
    """What pip would install for one target and extra (or why it could not)."""

    target: Target
    extra: str
    packages: dict[str, str]  # normalized name -> file name of the chosen artifact
    environment: dict[str, str]
    error: str = ""


def normalize(name: str) -> str:
    """PEP 503 name: ``Nvidia_CUBLAS`` -> ``nvidia-cublas``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_of(pyproject: Path) -> list[str]:
    """The extras pyproject.toml declares, in order."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project.get("optional-dependencies", {}))


def expects_tenseal(target: Target, extra: str) -> bool | None:
    """Whether TenSEAL must be in the resolution (None: not this extra's business)."""
    if extra not in ("ckks", "all"):
        return None
    return tuple(map(int, target.python_version.split("."))) >= (3, 11)


def problems(resolution: Resolution) -> list[str]:
    """Everything wrong with one resolution, as lines for a failure message."""
    where = f"{resolution.target.name} [{resolution.extra or 'core'}]"
    if resolution.error:
        return [f"{where}: pip could not resolve:\n{resolution.error}"]
    found = []
    wanted = resolution.target.marker_environment()
    seen = {key: resolution.environment.get(key) for key in wanted}
    if seen != wanted:
        found.append(f"{where}: pip evaluated markers for {seen}, not {wanted}")
    gpu = sorted(n for n in resolution.packages if n.startswith(FORBIDDEN_PREFIXES))
    if gpu:
        found.append(f"{where}: GPU-only packages: {', '.join(gpu)}")
    source = sorted(f for f in resolution.packages.values() if not f.endswith(".whl"))
    if source:
        found.append(f"{where}: not binary wheels: {', '.join(source)}")
    tenseal = expects_tenseal(resolution.target, resolution.extra)
    if tenseal is not None and tenseal != ("tenseal" in resolution.packages):
        state = "missing" if tenseal else "present (it has no wheel here)"
        found.append(f"{where}: tenseal {state}")
    return found


def _pip_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update({k: os.environ[k] for k in PIP_ENV_KEPT if k in os.environ})
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def resolve(wheel: Path, target: Target, extra: str, python: str) -> Resolution:
    """Ask pip what ``wheel[extra]`` would install on ``target``."""
    requirement = f"{wheel.resolve()}[{extra}]" if extra else str(wheel.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        command = [
            python, "-c", _PIP_SHIM, json.dumps(target.marker_environment()),
            "install", "--dry-run", "--quiet", "--ignore-installed",
            "--report", str(report), "--target", str(Path(tmp, "target")),
            "--only-binary=:all:", "--implementation", "cp",
            "--python-version", target.python_version,
            *(arg for tag in target.platform_tags() for arg in ("--platform", tag)),
            requirement,
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, env=_pip_environment()
        )
        if done.returncode != 0 or not report.exists():
            error = (done.stderr or done.stdout).strip() or f"exit {done.returncode}"
            return Resolution(target, extra, {}, {}, error=error)
        data: dict[str, Any] = json.loads(report.read_text())
    packages = {
        normalize(item["metadata"]["name"]): item["download_info"]["url"].rsplit(
            "/", 1
        )[-1]
        for item in data["install"]
    }
    packages.pop(normalize("ursa-fl"), None)
    return Resolution(target, extra, packages, dict(data.get("environment", {})))


def summary(resolution: Resolution, versions: Mapping[str, str]) -> str:
    """One line: the target, the extra and the versions that matter."""
    shown = ", ".join(
        f"{name} {versions[name]}"
        for name in ("torch", "tenseal", "onnxruntime")
        if name in versions
    )
    where = f"{resolution.target.name} [{resolution.extra or 'core'}]"
    return f"{where}: {len(resolution.packages)} wheels; {shown}"


def _versions(packages: Mapping[str, str]) -> dict[str, str]:
    return {name: file.split("-")[1] for name, file in packages.items()}


def check(
    wheel: Path,
    targets: Iterable[Target],
    extras: Sequence[str],
    jobs: int,
    python: str,
) -> list[str]:
    """Resolve every (target, extra) pair; print a line each; return the problems."""
    pairs = [(t, e) for t in targets for e in ["", *extras]]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        resolutions = list(
            pool.map(lambda p: resolve(wheel, p[0], p[1], python), pairs)
        )
    found: list[str] = []
    for resolution in resolutions:
        found += problems(resolution)
        if not resolution.error:
            print(summary(resolution, _versions(resolution.packages)), flush=True)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Check the wheel; exit 1 with every problem listed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="the built ursa-fl wheel")
    parser.add_argument("--jobs", type=int, default=4, help="pip runs at a time")
    parser.add_argument("--python", default=sys.executable, help="the pip to run")
    args = parser.parse_args(argv)
    start = time.monotonic()
    extras = extras_of(ROOT / "pyproject.toml")
    found = check(args.wheel, TARGETS, extras, args.jobs, args.python)
    elapsed = time.monotonic() - start
    if found:
        print("\n".join(["resolution check FAILED:", *found]), file=sys.stderr)
        return 1
    pairs = len(TARGETS) * (len(extras) + 1)
    print(f"resolution check passed: {pairs} resolutions in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
