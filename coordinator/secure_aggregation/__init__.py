"""Coordinator side of secure aggregation: the running masked sum and its unmasking."""

from ursa.coordinator.secure_aggregation.unmasking import (
    UnmaskError,
    add_masked,
    unmask_sum,
)
from ursa.crypto.shamir import UnmaskShare

__all__ = ["UnmaskError", "UnmaskShare", "add_masked", "unmask_sum"]
