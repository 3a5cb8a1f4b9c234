"""FedDisk on the coordinator: the MADE rounds, their encrypted loss, the switch."""

from ursa.coordinator.methods.feddisk.plugin import FeddiskPlugin

__all__ = ["FeddiskPlugin"]
