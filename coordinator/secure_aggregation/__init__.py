"""Secure aggregation on the coordinator."""
