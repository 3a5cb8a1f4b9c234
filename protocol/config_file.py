"""A service config from a TOML/JSON file plus ``URSA_*`` variables, or one clear error.

Both services load their config here (`ursa.coordinator.config.load_coordinator_config`,
`ursa.edge_sdk.config.load_device_config`), so an app that embeds the SDK gets
the CLI's messages: a file that is missing or does not parse, an unknown key
(with a "did you mean"), a bad value or variable becomes one `ConfigError`
naming the file or the variable, the key (list entries counted from 1) and
the reason, in a few lines and without a traceback.

Secrets never appear: pydantic's errors are rendered without their input
(``include_input=False``), and the values of secret-like variables and keys
(password, token, ...; misspelt too) are masked in the message as well.

Relative paths in a file resolve against the file's folder, not the working
directory: every `Path` setting, and a data set setting
(`PATH_LIKE_KEYS`) whose value names a ``.npz`` file.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ursa._compat import tomllib

__all__ = [
    "DEFAULT_ENV_PREFIX",
    "PATH_LIKE_KEYS",
    "ConfigError",
    "load_service_config",
    "read_config_file",
    "setting_paths",
]

DEFAULT_ENV_PREFIX = "URSA_"
PATH_LIKE_KEYS = frozenset({"data_file", "holdout_file"})
"""String settings that are a data set spec or a file: resolved when a ``.npz``."""
_SECRET_WORDS = ("pas", "pwd", "secret", "token")
"""Keys and variables whose values are masked (``pas``: misspellings too)."""
_MASK = "***"
_MAX_LINES = 6

Config = TypeVar("Config", bound=BaseModel)


class ConfigError(ValueError):
    """A config that cannot be used; ``str()`` is the message for the operator."""


def load_service_config(
    model: type[Config], path: Path | None, environ: Mapping[str, str]
) -> Config:
    """``model`` from ``path`` (if given) with the ``URSA_*`` variables of its fields.

    Variables whose first key is not a field of ``model`` are left alone (the
    other service's, or a test switch): the CLI refuses unknown ones itself.

    Raises:
        ConfigError: the message names the file or variable, the key and why.
    """
    secrets = [
        value
        for name, value in environ.items()
        if name.startswith(DEFAULT_ENV_PREFIX) and _is_secret(name)
    ]
    data: dict[str, Any] = {}
    if path is not None:
        data = read_config_file(path)
        secrets += list(_secret_values(data))
        data = _resolved(data, model, Path(path).resolve().parent)
    where = str(path) if path is not None else "the config"
    try:
        data = _with_variables(data, model, environ)
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(error, model, path, environ) for error in _errors(exc)]
        if len(lines) > _MAX_LINES:
            lines[_MAX_LINES - 1 :] = [f"... and {len(lines) - _MAX_LINES + 1} more"]
        raise ConfigError(_mask("\n".join(lines), secrets)) from None
    except ConfigError:
        raise
    except (ValueError, AttributeError, TypeError) as exc:
        raise ConfigError(_mask(f"{where}: {exc}", secrets)) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """A config file's table, or a `ConfigError` saying why not."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(raw)
        elif suffix == ".toml":
            data = tomllib.loads(raw.decode())
        else:
            raise ConfigError(f"{path}: a config file must end in .toml or .json")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a table/object")
    return data


def _with_variables(
    data: dict[str, Any], model: type[BaseModel], environ: Mapping[str, str]
) -> dict[str, Any]:
    """``data`` with each ``URSA_A__B`` variable of a field of ``model`` applied."""
    fields = set(model.model_fields)
    for name, raw in environ.items():
        if not name.startswith(DEFAULT_ENV_PREFIX) or len(name) == len(
            DEFAULT_ENV_PREFIX
        ):
            continue
        keys = name[len(DEFAULT_ENV_PREFIX) :].lower().split("__")
        if keys[0] not in fields:
            continue
        target = data
        for key in keys[:-1]:
            child = target.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{name}: {key!r} is not a table")
            target = child
        target[keys[-1]] = _variable_value(raw)
    return data


def _variable_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


# --- relative paths ----------------------------------------------------------------


def _resolved(
    data: dict[str, Any], model: type[BaseModel], base: Path
) -> dict[str, Any]:
    """``data`` with its relative paths made absolute under ``base``."""
    out = dict(data)
    for name, info in model.model_fields.items():
        value = out.get(name)
        if value is None:
            continue
        sub = _model_in(info.annotation)
        if sub is not None and isinstance(value, dict):
            out[name] = _resolved(value, sub, base)
        elif (
            isinstance(value, str)
            and _is_path(info.annotation, name, value)
            and not Path(value).expanduser().is_absolute()
        ):
            out[name] = str(base / value)
    return out


def _is_path(annotation: Any, name: str, value: str) -> bool:
    if annotation is Path:
        return True
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    if union and Path in typing.get_args(annotation):
        return True
    npz = value.lower().endswith(".npz") and ":" not in value
    return name in PATH_LIKE_KEYS and npz


# --- messages ------------------------------------------------------------------


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


def _describe(
    error: dict[str, Any],
    model: type[BaseModel],
    path: Path | None,
    env: Mapping[str, str],
) -> str:
    """One line: source, key and reason of one validation error."""
    loc = tuple(error.get("loc", ()))
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    key = _key_text(loc)
    unknown = error.get("type") == "extra_forbidden"
    variable = _variable_for(tuple(str(p) for p in loc), env)
    if variable is not None:
        return f"{variable}: {key}: {message}"
    hint = _key_hint(loc, model) if unknown else ""
    source = str(path) if path is not None else "the config"
    return f"{source}: {key}: {message}{hint}"


def _key_text(loc: tuple[Any, ...]) -> str:
    """``methods #2 .kind``-style: list entries counted from 1, as a reader counts."""
    if not loc:
        return "(the config as a whole)"
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int) and parts:
            parts[-1] = f"{parts[-1]} #{part + 1}"
        else:
            parts.append(str(part))
    return ".".join(parts)


def _key_hint(loc: tuple[Any, ...], model: type[BaseModel]) -> str:
    """`` (did you mean X?)`` for an unknown key, from the keys allowed there."""
    names = [str(p) for p in loc if not isinstance(p, int)]
    if not names:
        return ""
    paths = setting_paths(model)
    above = tuple(names[:-1])
    siblings = [p[-1] for p in paths if len(p) == len(names) and p[:-1] == above]
    close = difflib.get_close_matches(names[-1], siblings, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


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


# --- the settings' key paths ----------------------------------------------------


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
