"""FLICKER, device half: the ring, masked cosines and resampling of local data."""
