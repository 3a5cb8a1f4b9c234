"""The `ursa` command line: one entry point; each area registers its subcommands.

Each area lives in its own `ursa.tools.cli.<area>` module with a
`register(subparsers)` function, so heavy imports (torch, TenSEAL) happen only
when the subcommand that needs them runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from ursa._version import __version__
from ursa.tools.cli.config_load import ConfigError
from ursa.tools.cli.leave import leave
from ursa.tools.cli.logs import LOG_FORMATS, configure_logging

Handler = Callable[[argparse.Namespace], int]

_AREAS = (
    "ursa.tools.cli.bench",
    "ursa.tools.cli.simulate",
    "ursa.tools.cli.broker",
    "ursa.tools.cli.service",
    "ursa.tools.cli.units",
    "ursa.tools.cli.demo",
    "ursa.tools.cli.doctor",
    "ursa.tools.cli.operator",
)


def build_parser() -> argparse.ArgumentParser:
    """Return the parser with every area's subcommands attached."""
    parser = argparse.ArgumentParser(
        prog="ursa",
        description="Federated learning for fleets of small devices with skewed data.",
    )
    parser.add_argument("--version", action="version", version=f"ursa {__version__}")
    parser.add_argument(
        "--log-level",
        help="logging level (default INFO for `coordinator serve` and `device "
        "run`, WARNING otherwise)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text, or json: one JSON object per line for log shippers",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _AREAS:
        importlib.import_module(name).register(sub)
    return parser


def log_level(args: argparse.Namespace) -> str:
    """``--log-level``, else the subcommand's default, else WARNING.

    Long-running services (``coordinator serve``, ``device run``) default to
    INFO, so their progress shows without a flag.
    """
    level: str = args.log_level or getattr(args, "default_log_level", "WARNING")
    return level


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    return _run(build_parser().parse_args(argv))


def entry() -> None:
    """The ``ursa`` command: `main`, then leave the process.

    A service command (``coordinator serve``, ``device run``) leaves at once
    after its clean stop (`ursa.tools.cli.leave`); the others exit normally.
    """
    args = build_parser().parse_args()
    code = _run(args)
    if getattr(args, "leave", False):
        leave(code)
    sys.exit(code)


BROKEN_PIPE_EXIT = 128 + 13
"""The exit code of a command whose reader went away (128 + SIGPIPE, as git's)."""


def _run(args: argparse.Namespace) -> int:
    configure_logging(log_level(args), args.log_format)
    handler: Handler = args.handler
    try:
        code = handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at exit
        return code
    except ConfigError as exc:  # one clear message, no traceback
        print(f"ursa: config error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ursa coordinator status | head`: the reader is done
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error at interpreter exit
        return BROKEN_PIPE_EXIT
