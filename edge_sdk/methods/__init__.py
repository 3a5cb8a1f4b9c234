"""The device halves of ursa's methods, one package each."""
