"""In-process simulators: Dubhe selection, FLICKER, method comparisons by training."""
