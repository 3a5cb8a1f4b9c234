"""The `ursa` command line: the entry point and one module per area."""
