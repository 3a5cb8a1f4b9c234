"""Loading a service config for a command: any mistake is one clear message.

`load_config` wraps `load_coordinator_config` / `load_device_config` so that a
file that is missing or does not parse, an unknown key, a bad value or an
``URSA_*`` variable becomes a `ConfigError` naming the file or the variable,
the key and the reason, in a few lines; the CLI prints it and exits with 2
(`ursa.tools.cli.app.main`), without a traceback.

Secrets never appear: pydantic's errors are rendered without their input
(``include_input=False``), and the values of secret-like variables and keys
(password, token, ...; misspelt too) are masked in the message as well. An
``URSA_*`` variable that names no setting of either service (nor one of the
test and build switches in `OTHER_VARIABLES`) is an error with a "did you
mean" hint; one that belongs to the other service is ignored, so one
environment may serve a coordinator and a device on the same host.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ursa._compat import tomllib

__all__ = ["OTHER_VARIABLES", "ConfigError", "load_config", "setting_paths"]

OTHER_VARIABLES = frozenset(
    {"URSA_REQUIRE_MOSQUITTO", "URSA_FAULTS_EXTENDED", "URSA_DEBIAN_MIRROR"}
)
"""``URSA_*`` variables that are not settings (tests, CI, platform scripts)."""

DEFAULT_ENV_PREFIX = "URSA_"
_SECRET_WORDS = ("pas", "pwd", "secret", "token")
"""Keys and variables whose values are masked (``pas``: misspellings too)."""
_MASK = "***"
_MAX_LINES = 6

Config = TypeVar("Config", bound=BaseModel)


class ConfigError(Exception):
    """A config that cannot be used; ``str()`` is the message for the operator."""


def load_config(
    model: type[Config],
    loader: Callable[[Path | None, Mapping[str, str]], Config],
    path: Path | None,
    environ: Mapping[str, str],
) -> Config:
    """``loader(path, environ)``, with every failure turned into a `ConfigError`.

    Raises:
        ConfigError: the message names the file or variable, the key and why.
    """
    _check_variables(model, environ)
    secrets = [
        value
        for name, value in environ.items()
        if name.startswith(DEFAULT_ENV_PREFIX) and _is_secret(name)
    ]
    where = str(path) if path is not None else "the config"
    try:
        if path is not None:
            secrets += list(_secret_values(_read(path)))
        return loader(path, environ)
    except ValidationError as exc:
        lines = [_describe(error, path, environ) for error in _errors(exc)]
        if len(lines) > _MAX_LINES:
            lines[_MAX_LINES - 1 :] = [f"... and {len(lines) - _MAX_LINES + 1} more"]
        raise ConfigError(_mask("\n".join(lines), secrets)) from None
    except ConfigError:
        raise
    except (ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(_mask(f"{where}: {exc}", secrets)) from None


def _read(path: Path) -> Any:
    """The file's data (to find its secrets), or a `ConfigError` saying why not."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(raw)
        if path.suffix.lower() == ".toml":
            return tomllib.loads(raw.decode())
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    raise ConfigError(f"{path}: a config file must end in .toml or .json")


def _secret_values(data: Any, secret: bool = False) -> Iterator[str]:
    """Strings held under secret-like keys (``password``, ``token``, ...)."""
    if isinstance(data, dict):
        for key, value in data.items():
            named = _is_secret(str(key))
            yield from _secret_values(value, secret or named)
    elif isinstance(data, list):
        for value in data:
            yield from _secret_values(value, secret)
    elif secret and data is not None:
        yield str(data)


def _is_secret(name: str) -> bool:
    return any(word in name.lower() for word in _SECRET_WORDS)


def _mask(text: str, secrets: list[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 3:
            text = text.replace(secret, _MASK)
    return text


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [dict(e) for e in exc.errors(include_input=False, include_url=False)]


def _describe(error: dict[str, Any], path: Path | None, env: Mapping[str, str]) -> str:
    """One line: source, key and reason of one validation error."""
    loc = tuple(str(part) for part in error.get("loc", ()))
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    variable = _variable_for(loc, env)
    key = ".".join(loc) if loc else "(the config as a whole)"
    if variable is not None:
        hint = ""
        if error.get("type") == "extra_forbidden":
            hint = _did_you_mean(variable, _all_variables())
        return f"{variable}: {key}: {message}{hint}"
    source = str(path) if path is not None else "the config"
    return f"{source}: {key}: {message}"


def _variable_for(loc: tuple[str, ...], env: Mapping[str, str]) -> str | None:
    """The ``URSA_*`` variable that set ``loc`` (or a table above it), if any."""
    for end in range(len(loc), 0, -1):
        wanted = [part.lower() for part in loc[:end]]
        for name in env:
            if name.startswith(DEFAULT_ENV_PREFIX):
                keys = name[len(DEFAULT_ENV_PREFIX) :].lower().split("__")
                if keys == wanted:
                    return name
    return None


# --- the settings' variable names ---------------------------------------------


def setting_paths(model: type[BaseModel]) -> dict[tuple[str, ...], bool]:
    """Every setting's key path -> whether keys below it are free (dicts, extras)."""
    paths: dict[tuple[str, ...], bool] = {}
    for name, info in model.model_fields.items():
        sub = _model_in(info.annotation)
        if sub is None:
            paths[(name,)] = _is_mapping(info.annotation)
            continue
        paths[(name,)] = sub.model_config.get("extra") == "allow"
        for below, free in setting_paths(sub).items():
            path = (name, *below)
            paths[path] = free
    return paths


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (``Model`` or ``Model | None``), if one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [_model_in(arg) for arg in typing.get_args(annotation)]
        found = [m for m in models if m is not None]
        return found[0] if len(found) == 1 else None
    return None


def _is_mapping(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_mapping(arg) for arg in typing.get_args(annotation))
    return origin is dict or annotation is dict


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
