"""Studies over many scenarios: sweeps of a base scenario's fields (``sweep``) and their report."""
