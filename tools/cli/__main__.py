"""``python -m ursa.tools.cli``: the `ursa` command."""

from ursa.tools.cli.app import entry

entry()
