"""Methods of the device: one folder per method."""
