"""The configuration reference page, written from the pydantic config models.

Every key of ``coordinator.toml`` and ``device.toml`` (and of each
``[[methods]]`` table) with its type, default and description, so the page
cannot drift from the code: a test compares the committed page with this
module's output. Descriptions are ``Field(description=...)`` or, failing
that, the attribute docstring under the field in the model's source.

Run (from a checkout)::

    python -m ursa.tools.docs.config_reference --out docs/reference/configuration.md
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ursa.coordinator.config import CoordinatorConfig
from ursa.edge_sdk.config import DeviceConfig
from ursa.tools.docs.page import write_page

COMMAND = (
    "python -m ursa.tools.docs.config_reference --out docs/reference/configuration.md"
)

HEADER = f"""# Configuration reference

Generated from the pydantic models by `{COMMAND}`
(`tools/docs/config_reference.py`; a test fails when this page and the models
differ). Both files are TOML (or JSON); every key can be overridden from the
environment as `URSA_<KEY>` for a top-level key and `URSA_<SECTION>__<KEY>`
for a nested one (`URSA_K=20`, `URSA_BROKER__PASSWORD=...`). Unknown keys are
refused with a "did you mean" hint. Two complete pairs are in `examples/`.
"""


def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the string literal right under it, over the model's bases."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if (
            not (isinstance(cls, type) and issubclass(cls, BaseModel))
            or cls is BaseModel
        ):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


def type_name(annotation: object) -> str:
    """A short, readable rendering of a field's type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"list[{type_name(args[0])}]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def default_text(field: FieldInfo) -> str:
    """The default as TOML readers see it; "required" when there is none."""
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return "(section)" if isinstance(made, BaseModel) else f"`{made!r}`"
    if field.default is PydanticUndefined:
        return "required"
    if field.default is None:
        return "none"
    value = field.default
    if isinstance(value, tuple) and all(isinstance(v, BaseModel) for v in value):
        kinds = ", ".join(f'{{kind = "{getattr(v, "kind", "?")}"}}' for v in value)
        return f"`[{kinds}]`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def submodels(annotation: object) -> list[type[BaseModel]]:
    """The models a field's type holds (a section, an optional one, a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in submodels(arg)]


def cell(text: str) -> str:
    """One Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def model_rows(model: type[BaseModel]) -> Iterator[str]:
    """The table of one model's own scalar keys."""
    docs = attribute_docstrings(model)
    yield "| key | type | default | description |"
    yield "| --- | --- | --- | --- |"
    for name, field in model.model_fields.items():
        description = field.description or docs.get(name, "") or _kind_text(name, field)
        yield (
            f"| `{name}` | {cell(type_name(field.annotation))} "
            f"| {cell(default_text(field))} | {cell(description)} |"
        )


def _kind_text(name: str, field: FieldInfo) -> str:
    """A ``[[methods]]`` table's ``kind``: the method it names."""
    if name == "kind" and isinstance(field.default, str):
        return f'Names the method: ``kind = "{field.default}"``.'
    return ""


def model_section(model: type[BaseModel], title: str, level: int) -> Iterator[str]:
    """A heading, the model's docstring, its keys, then its sections."""
    yield f"{'#' * level} `{title}`"
    yield ""
    if model.__doc__:
        yield inspect.cleandoc(model.__doc__).split("\n\n")[0].replace("\n", " ")
        yield ""
    yield from model_rows(model)
    yield ""
    for name, field in model.model_fields.items():
        children = submodels(field.annotation)
        if name == "methods":
            for child in children:
                kind = child.model_fields["kind"].default
                yield from model_section(
                    child, f'[[methods]] kind = "{kind}"', level + 1
                )
        else:
            for child in children:
                yield from model_section(child, f"[{name}]", level + 1)


def render() -> str:
    """The whole page."""
    lines = [HEADER]
    for title, model in (
        ("coordinator.toml", CoordinatorConfig),
        ("device.toml", DeviceConfig),
    ):
        lines.extend(model_section(model, title, 2))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page to ``--out`` (or print it)."""
    return write_page(render, "Write the configuration reference page.", argv)


if __name__ == "__main__":
    raise SystemExit(main())
