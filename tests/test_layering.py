"""The packages' import direction, and torch kept out of the light import paths."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("crypto", "models", "protocol", "edge_sdk", "coordinator", "tools", "bench")

# package -> the ursa subpackages it must never import
FORBIDDEN: dict[str, set[str]] = {
    "crypto": {"models", "protocol", "edge_sdk", "coordinator", "tools", "bench"},
    "models": {"crypto", "protocol", "edge_sdk", "coordinator", "tools", "bench"},
    "protocol": {"models", "edge_sdk", "coordinator", "tools", "bench"},
    "edge_sdk": {"coordinator", "tools", "bench"},
    "coordinator": {"edge_sdk", "tools", "bench"},
}
# modules allowed to import torch
TORCH_ALLOWED_PREFIXES = ("models/", "edge_sdk/training")


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_down(package: str) -> None:
    violations = []
    for path in _modules(package):
        for name, line in _imports(path):
            parts = name.split(".")
            if parts[0] == "ursa" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not violations, "\n".join(violations)


def test_torch_only_in_models_and_training() -> None:
    violations = []
    for package in PACKAGES:
        for path in _modules(package):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(TORCH_ALLOWED_PREFIXES):
                continue
            tree = ast.parse(path.read_text())
            for node in tree.body:  # module level only: lazy imports are fine
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(n == "torch" or n.startswith("torch.") for n in names):
                    violations.append(f"{rel}:{node.lineno}")
    assert not violations, "torch imported at module level in " + ", ".join(violations)


@pytest.mark.parametrize(
    "module",
    [
        "ursa.crypto",
        "ursa.protocol",
        "ursa.coordinator",
        "ursa.edge_sdk",
        "ursa.tools.cli.app",
    ],
)
def test_light_import_paths_do_not_load_torch(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "bad = [m for m in ('torch', 'tenseal', 'onnxruntime') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
