"""Cost tables: measured kernel and collective times as data (format, reading and writing, interpolation,
which table a run uses). Below the cost models, which consult them; the tools that produce them (runner,
importers) are ``simulator/calibration``."""
