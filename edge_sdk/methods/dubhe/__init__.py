"""Dubhe on the device: volunteer draws, encrypted distributions, the agent."""
