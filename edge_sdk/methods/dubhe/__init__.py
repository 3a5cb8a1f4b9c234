"""Dubhe on the device: volunteer draws, encrypted distributions, the agent."""

from ursa.edge_sdk.methods.dubhe.method import Dubhe

__all__ = ["Dubhe"]
