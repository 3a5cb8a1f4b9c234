"""The ursa CLI and what it runs: simulators, data sets, the demo, brokers."""
