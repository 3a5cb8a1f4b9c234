"""Methods of the coordinator: one folder per method."""
