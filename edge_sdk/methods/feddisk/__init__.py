"""FedDisk on the device: the MADE phase's encrypted losses, the switch, weights."""

from ursa.edge_sdk.methods.feddisk.method import FedDisk

__all__ = ["FedDisk"]
