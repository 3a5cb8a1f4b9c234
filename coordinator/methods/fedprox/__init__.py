"""FedProx's coordinator half: FedAvg's aggregation, and ``mu`` signed to devices.

The coordinator learns nothing FedAvg does not tell it: the proximal term
only changes how each device trains locally.
"""

from ursa.coordinator.methods.fedprox.settings import FedProxSpec

__all__ = ["FedProxSpec"]
