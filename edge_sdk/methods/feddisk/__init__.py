"""FedDisk on the device: the MADE phase's encrypted losses, the switch, weights."""
