"""`ursa model init`: write seeded initial weights for the coordinator (needs torch).

The coordinator has no torch, so its ``[training] initial_weights`` file is
made here, with the ``train`` extra, in `ursa.models.weights`' format::

    ursa model init --model mlp --input-dim 64 --classes 10 --out weights.ursw
    ursa model init --model made --input-dim 64 --hidden-sizes 64 --out made.ursw
    ursa model init --model digits_cnn:build --options '{"num_classes": 10}' \
        --out weights.ursw

(the second is FedDisk's global MADE: ``--hidden-sizes`` must equal the
devices' ``feddisk.made_hidden_sizes``; the third is a model named by import
path, `ursa.models.spec`, with its factory's keyword arguments as JSON: torch
only when the factory builds a torch module).

It prints the model options the devices' ``[training]`` sections must use.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ursa.tools.compose import TRAIN_EXTRA_HINT

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["TRAIN_EXTRA_HINT", "model_options", "register", "write_initial_weights"]


def register(sub: Subparsers) -> None:
    """Attach `ursa model init`."""
    model = sub.add_parser("model", help="global model files")
    commands = model.add_subparsers(dest="model_command", required=True)
    init = commands.add_parser(
        "init", help="write initial weights for the coordinator (train extra)"
    )
    init.add_argument(
        "--model",
        type=_architecture,
        default="mlp",
        help="mlp, cnn, made or an import path package.module:factory",
    )
    init.add_argument(
        "--options",
        type=json.loads,
        help="an import path's keyword arguments, as a JSON object",
    )
    init.add_argument("--classes", type=int, help="number of classes (mlp, cnn)")
    init.add_argument("--input-dim", type=int, help="mlp, made: features per sample")
    init.add_argument(
        "--hidden-sizes", type=int, nargs="+", help="mlp, made: hidden layer widths"
    )
    init.add_argument(
        "--input-shape", type=int, nargs=3, metavar=("C", "H", "W"), help="cnn"
    )
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--out", type=Path, required=True, help="weights file to write")
    init.set_defaults(handler=_init)


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The architecture's config from the command line (JSON-able).

    Raises:
        ValueError: an option the architecture needs is missing.
    """
    from ursa.models.spec import is_import_path

    if is_import_path(args.model):
        given = args.options if args.options is not None else {}
        if not isinstance(given, dict):
            raise ValueError("--options must be a JSON object")
        return dict(given)
    options: dict[str, Any] = {}
    if args.model != "made":
        if args.classes is None:
            raise ValueError(f"--model {args.model} needs --classes")
        options["num_classes"] = args.classes
    if args.model in ("mlp", "made"):
        if args.input_dim is None:
            raise ValueError(f"--model {args.model} needs --input-dim")
        options["input_dim"] = args.input_dim
        if args.hidden_sizes:
            options["hidden_sizes"] = list(args.hidden_sizes)
        elif args.model == "made":  # the devices' FeddiskSettings default
            # here, not at the top: every `ursa` command imports this module
            from ursa.edge_sdk.methods.feddisk.settings import DEFAULT_MADE_HIDDEN_SIZES

            options["hidden_sizes"] = list(DEFAULT_MADE_HIDDEN_SIZES)
    elif args.input_shape is not None:
        options["input_shape"] = list(args.input_shape)
    return options


def write_initial_weights(
    path: Path, architecture: str, options: Mapping[str, Any], *, seed: int = 0
) -> None:
    """Write seeded initial weights (`ursa.models.weights` bytes, float32).

    Raises:
        ImportError: torch is not installed (message: the ``train`` extra).
        ursa.models.registry.ModelConfigError: invalid ``options``.
    """
    from ursa.models.spec import is_import_path
    from ursa.models.weights import arrays_to_bytes

    if is_import_path(architecture):
        from ursa.models.reference import reference_arrays

        try:
            arrays = reference_arrays(architecture, options, seed=seed)
        except ImportError as exc:
            raise ImportError(f"ursa model init {TRAIN_EXTRA_HINT}") from exc
        path.write_bytes(arrays_to_bytes(arrays))
        return
    try:
        from ursa.models.registry import initial_arrays
    except ImportError as exc:
        raise ImportError(f"ursa model init {TRAIN_EXTRA_HINT}") from exc

    arrays = initial_arrays(architecture, options, seed=seed)
    path.write_bytes(arrays_to_bytes(arrays))


def _init(args: argparse.Namespace) -> int:
    try:
        options = model_options(args)
        write_initial_weights(args.out, args.model, options, seed=args.seed)
    except (ImportError, ValueError, OSError) as exc:
        print(f"ursa model init: {exc}", file=sys.stderr)
        return 2
    if args.model == "made":
        hidden = json.dumps(options["hidden_sizes"])
        print(f"wrote {args.out}; the coordinator's FedDisk method:")
        print('[[methods]]\nkind = "feddisk"')
        print(f'made_initial_weights = "{args.out}"')
        print("and the devices' FedDisk method:")
        print('[[methods]]\nkind = "feddisk"')
        print(f"made_hidden_sizes = {hidden}")
        return 0
    print(f"wrote {args.out}; devices' [training] section:")
    print(f'architecture = "{args.model}"')
    print(f"model_options = {_toml_inline(options)}")
    return 0


def _architecture(value: str) -> str:
    """``--model``: a built-in or an import path (argparse type)."""
    from ursa.models.spec import is_import_path

    if value in ("mlp", "cnn", "made") or is_import_path(value):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r}: use mlp, cnn, made or an import path package.module:factory"
    )


def _toml_inline(options: Mapping[str, Any]) -> str:
    items = ", ".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
    return "{ " + items + " }"
