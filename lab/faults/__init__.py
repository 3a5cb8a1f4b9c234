"""Fault injection: real `coordinator serve` / `device run` processes on a Mosquitto.

`FaultFleet` writes the configs, starts and SIGKILLs the processes, stops and
starts the broker, and judges a run from outside (logs, the coordinator's
store read-only, the final checkpoint's accuracy on held-out digits).
`python -m ursa.lab.faults.soak` runs random churn and broker restarts for
a bounded time and prints a summary. `ursa.lab.faults.hostile` builds a
flood and malformed messages for a rogue session (`ROGUE`'s credentials).
"""

from ursa.lab.faults.fleet import (
    OBSERVER,
    ROGUE,
    FaultFleet,
    FleetSettings,
    RunOutcome,
)

__all__ = ["OBSERVER", "ROGUE", "FaultFleet", "FleetSettings", "RunOutcome"]
