"""FLICKER, coordinator half: the CKKS key owner that balances the federation's data."""
