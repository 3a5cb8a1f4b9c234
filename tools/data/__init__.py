"""Data sets, their loaders, partitioners and label-distribution metrics."""
