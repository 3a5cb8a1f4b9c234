"""CLIMB on the coordinator: the encrypted dual step before a round trains."""

from ursa.coordinator.methods.climb.dual_step import ClimbDualStep

__all__ = ["ClimbDualStep"]
