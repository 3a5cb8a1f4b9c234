"""The coordinator halves of ursa's methods, one package each."""
