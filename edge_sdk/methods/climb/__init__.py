"""CLIMB on the device: the encrypted dual step and the scaled delta."""
