"""CLIMB on the device: the encrypted dual step and the scaled delta."""

from ursa.edge_sdk.methods.climb.method import DUAL_WAIT_S, Climb

__all__ = ["DUAL_WAIT_S", "Climb"]
