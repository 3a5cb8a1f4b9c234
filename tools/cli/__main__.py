"""``python -m ursa.tools.cli``: the `ursa` command."""

import sys

from ursa.tools.cli.app import main

sys.exit(main())
