"""FedProx on the device: local training pulled toward the global model."""

from ursa.edge_sdk.methods.fedprox.method import FedProx, ProximalUnsupportedError

__all__ = ["FedProx", "ProximalUnsupportedError"]
