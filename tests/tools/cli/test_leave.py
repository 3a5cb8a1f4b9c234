"""A service command leaves its process at once after a clean stop."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_leave_flushes_output_and_exits_with_the_code_despite_a_stuck_teardown() -> (
    None
):
    code = textwrap.dedent(
        """
        import logging, sys, threading, time
        from ursa.tools.cli.leave import leave

        class Stuck:  # a finaliser that would hold interpreter exit forever
            def __del__(self):
                time.sleep(3600)

        keep = Stuck()
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("t").info("logged before leaving")
        print("printed before leaving", end="")
        leave(3)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3
    assert done.stdout == "printed before leaving"
    assert "logged before leaving" in done.stderr
