"""The operator's commands that both sides name in their log lines.

A refused enrolment tells the operator, on the device and on the
coordinator, the one command that admits the device; both spell it here.
"""

from __future__ import annotations

__all__ = ["enrol_command"]


def enrol_command(device_id: str, fingerprint: str) -> str:
    """The command that pins ``device_id``'s identity on the coordinator's host."""
    return (
        "ursa coordinator enrol --config <coordinator config> "
        f"--device {device_id} --fingerprint {fingerprint}"
    )
