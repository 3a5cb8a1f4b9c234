"""`ursa demo`: the whole system on one machine, training or selection only."""
