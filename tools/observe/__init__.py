"""The operator's HTTP view of a coordinator: ``/metrics``, ``/api/status``, ``/``."""
