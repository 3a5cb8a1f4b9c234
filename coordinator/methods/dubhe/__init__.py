"""Dubhe on the coordinator: volunteers, tentative sets, the agent's answer."""

from ursa.coordinator.methods.dubhe.selection import DubheSelection, DubheStep

__all__ = ["DubheSelection", "DubheStep"]
