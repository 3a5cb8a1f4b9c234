"""The error of a simulation on the production runtime that stops making progress.

Both service engines (`ursa.lab.simulate.selection_service`,
`ursa.lab.simulate.feddisk_service`) drive a real `CoordinatorService` and
real devices under a fake clock; a run whose rounds stop advancing is a bug
or a setting the runtime refuses, and is reported as this one error.
"""

from __future__ import annotations

__all__ = ["ServiceRunError"]


class ServiceRunError(RuntimeError):
    """The simulated federation stopped making progress (a stuck run)."""
