"""Random selection: the baseline that field trials compare Dubhe against."""

from ursa.coordinator.methods.random.selection import RandomSelection

__all__ = ["RandomSelection"]
