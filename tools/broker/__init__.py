"""Brokers: Mosquitto config and runner, the embedded demo broker, TLS files."""
