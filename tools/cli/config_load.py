"""Loading a service config for a command: any mistake is one clear message.

`load_config` runs `load_coordinator_config` / `load_device_config` (whose
`ConfigError`s name the file or the variable, the key and the reason, with
no secret: `ursa.protocol.config_file`) after one check only a command can
make, since it knows both services: an ``URSA_*`` variable that names no
setting of either service (nor one of the test and build switches in
`OTHER_VARIABLES`) is an error with a "did you mean" hint; one that belongs
to the other service is ignored, so one environment may serve a coordinator
and a device on the same host. The CLI prints the message and exits with 2
(`ursa.tools.cli.app.main`), without a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from ursa.protocol.config_file import DEFAULT_ENV_PREFIX, ConfigError, setting_paths

__all__ = ["OTHER_VARIABLES", "ConfigError", "load_config", "setting_paths"]

OTHER_VARIABLES = frozenset(
    {"URSA_REQUIRE_MOSQUITTO", "URSA_FAULTS_EXTENDED", "URSA_DEBIAN_MIRROR"}
)
"""``URSA_*`` variables that are not settings (tests, CI, platform scripts)."""

Config = TypeVar("Config", bound=BaseModel)


def load_config(
    model: type[Config],
    loader: Callable[[Path | None, Mapping[str, str]], Config],
    path: Path | None,
    environ: Mapping[str, str],
) -> Config:
    """``loader(path, environ)`` once every ``URSA_*`` variable names a setting.

    Raises:
        ConfigError: the message names the file or variable, the key and why.
    """
    _check_variables(model, environ)
    return loader(path, environ)


def _known(paths: dict[tuple[str, ...], bool], keys: list[str]) -> bool:
    for end in range(len(keys), 0, -1):
        path = tuple(keys[:end])
        if path in paths:
            return end == len(keys) or paths[path]
    return False


def _services() -> tuple[type[BaseModel], ...]:
    """Both services' configs (imported when a command loads one)."""
    from ursa.coordinator.config import CoordinatorConfig
    from ursa.edge_sdk.config import DeviceConfig

    return (CoordinatorConfig, DeviceConfig)


def _all_variables() -> list[str]:
    names = set(OTHER_VARIABLES)
    for model in _services():
        for path in setting_paths(model):
            names.add(DEFAULT_ENV_PREFIX + "__".join(path).upper())
    return sorted(names)


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _check_variables(model: type[BaseModel], environ: Mapping[str, str]) -> None:
    """Refuse ``URSA_*`` variables that name no setting anywhere.

    Raises:
        ConfigError: one line per unknown variable, with a hint.
    """
    mine = setting_paths(model)
    others = [setting_paths(m) for m in _services()]
    unknown = []
    for name in sorted(environ):
        if not name.startswith(DEFAULT_ENV_PREFIX) or name in OTHER_VARIABLES:
            continue
        keys = name[len(DEFAULT_ENV_PREFIX) :].lower().split("__")
        if _known(mine, keys) or any(_known(paths, keys) for paths in others):
            continue
        hint = _did_you_mean(name, _all_variables())
        unknown.append(f"{name}: no such setting{hint}")
    if unknown:
        raise ConfigError("\n".join(unknown))
