"""Imports point down the layers, torch stays out of the light import paths, and a
method's folder is reached from outside only through the modules listed below."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("crypto", "models", "protocol", "edge_sdk", "coordinator", "tools")
CHECKOUT_ONLY = ("lab", "bench")
"""The lab and the benchmarks: run from a checkout, not in the wheel."""
PACKAGES = (*PRODUCT, *CHECKOUT_ONLY)

# package -> the ursa subpackages it must never import
FORBIDDEN: dict[str, set[str]] = {
    "crypto": {
        "models",
        "protocol",
        "edge_sdk",
        "coordinator",
        "tools",
        "lab",
        "bench",
    },
    "models": {
        "crypto",
        "protocol",
        "edge_sdk",
        "coordinator",
        "tools",
        "lab",
        "bench",
    },
    "protocol": {"models", "edge_sdk", "coordinator", "tools", "lab", "bench"},
    "edge_sdk": {"coordinator", "tools", "lab", "bench"},
    "coordinator": {"edge_sdk", "tools", "lab", "bench"},
    "tools": {"lab", "bench"},
}
# product modules allowed to import the lab or the benchmarks, and why
CHECKOUT_GATES: dict[str, str] = {
    "tools/cli/simulate.py": "`ursa simulate` runs ursa.lab when a checkout has it",
    "tools/cli/bench.py": "`ursa bench` runs ursa.bench when a checkout has it",
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
        if path.relative_to(ROOT).as_posix() in CHECKOUT_GATES:
            continue
        for name, line in _imports(path):
            parts = name.split(".")
            if parts[0] == "ursa" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not violations, "\n".join(violations)


def test_only_the_checkout_gates_import_the_lab_or_the_benchmarks() -> None:
    importers = {
        path.relative_to(ROOT).as_posix()
        for package in PRODUCT
        for path in _modules(package)
        if any(
            name.split(".")[:2] in (["ursa", "lab"], ["ursa", "bench"])
            for name, _ in _imports(path)
        )
    }
    assert importers == set(CHECKOUT_GATES)


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


# modules outside ``methods/`` that may import a method's folder, and why
METHOD_IMPORTERS: dict[str, str] = {
    "edge_sdk/__init__.py": "the public API re-exports the built-in methods",
    "coordinator/__init__.py": "the public API re-exports the built-in methods",
    "edge_sdk/methods_config.py": "a [[methods]] table's settings class per kind",
    "coordinator/methods_config.py": "a [[methods]] table's settings class per kind",
}


def _method_imports(path: Path) -> list[tuple[str, str, int]]:
    """``(side, method, line)`` for every import of ``ursa.<side>.methods.<m>``.

    Every import counts (module level, in functions, under TYPE_CHECKING);
    the registry (``methods/registry.py``) is not a method.
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module in {"ursa.edge_sdk.methods", "ursa.coordinator.methods"}:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if (
                len(parts) > 3
                and parts[:1] == ["ursa"]
                and parts[1] in {"edge_sdk", "coordinator"}
                and parts[2] == "methods"
                and parts[3] != "registry"
            ):
                found.append((parts[1], parts[3], node.lineno))
    return found


def _method_of(path: Path) -> str | None:
    """The method folder ``path`` lies in (``<side>/methods/<m>/``), if any."""
    parts = path.relative_to(ROOT).parts
    return parts[2] if len(parts) > 3 and parts[1] == "methods" else None


def test_a_method_never_imports_another_method() -> None:
    violations = []
    for side in ("edge_sdk", "coordinator"):
        for path in _modules(side):
            own = _method_of(path)
            if own is None:
                continue
            for _, method, line in _method_imports(path):
                if method != own:
                    rel = path.relative_to(ROOT)
                    violations.append(f"{rel}:{line} imports methods/{method}")
    assert not violations, "\n".join(violations)


def test_only_the_registries_import_a_method_from_outside_methods() -> None:
    violations, importers = [], set()
    for side in ("edge_sdk", "coordinator"):
        for path in _modules(side):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(f"{side}/methods/"):
                continue
            for _, method, line in _method_imports(path):
                importers.add(rel)
                if rel not in METHOD_IMPORTERS:
                    violations.append(f"{rel}:{line} imports methods/{method}")
    assert not violations, "\n".join(violations)
    stale = sorted(set(METHOD_IMPORTERS) - importers)
    assert not stale, f"no longer import a method, drop from METHOD_IMPORTERS: {stale}"


def test_dubhe_is_reached_from_anywhere_outside_methods_only_through_the_registry() -> (
    None
):
    """Dubhe's coordinator half (its records and migration too) across every
    package, the lab and the benchmarks included: only the registry and the
    listed public API name ``coordinator/methods/dubhe/``."""
    violations = []
    for package in PACKAGES:
        for path in _modules(package):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("coordinator/methods/") or rel in METHOD_IMPORTERS:
                continue
            for side, method, line in _method_imports(path):
                if (side, method) == ("coordinator", "dubhe"):
                    violations.append(f"{rel}:{line} imports coordinator/methods/dubhe")
    assert not violations, "\n".join(violations)


ROLE_UNIONS = {"SelectionSpec", "TrainingSpec", "BalancingSpec"}
"""Narrowing a table to its role (the settings module's lookups) names no method."""


def _spec_checks(source: str) -> list[tuple[str, int]]:
    """``(spec class, line)`` of every ``isinstance(x, <X>Spec)`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            continue
        kinds = node.args[1]
        for kind in kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]:
            name = kind.attr if isinstance(kind, ast.Attribute) else None
            name = kind.id if isinstance(kind, ast.Name) else name
            if name and name.endswith("Spec") and name not in ROLE_UNIONS:
                found.append((name, node.lineno))
    return found


def test_only_the_method_tables_ask_which_method_a_spec_is() -> None:
    """Composition looks a kind up in the table (`coordinator/methods/registry.py`);
    no module of ``coordinator/`` outside ``methods/``, nor of ``tools/``,
    branches on a method's settings class."""
    violations = []
    for package in ("coordinator", "tools"):
        for path in _modules(package):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("coordinator/methods/"):
                continue
            for name, line in _spec_checks(path.read_text()):
                violations.append(f"{rel}:{line} isinstance(..., {name})")
    assert not violations, "\n".join(violations)


def test_the_spec_check_finds_a_method_named_by_its_settings_class() -> None:
    source = (
        "if isinstance(method, FeddiskSpec): pass\n"
        "ok = isinstance(spec, (TrainingSpec, specs.ClimbDeviceSpec))\n"
        "fine = isinstance(spec, SelectionSpec) or isinstance(spec, int)\n"
    )
    assert _spec_checks(source) == [("FeddiskSpec", 1), ("ClimbDeviceSpec", 2)]
