"""What the command modules share: exit statuses and the ``--kernels`` option."""

from __future__ import annotations

from simulator.scenario.schema import Scenario
from simulator.tables.select import check_choice

# Exit status: 0 = simulated and fits; 2 = bad input (one line on stderr naming the field); 3 = simulated, but the
# run (compare: any of its runs) does not fit in GPU (or, offloading, host) memory; validate: 1 = a case failed
# or the --check gate missed.
EXIT_OUT_OF_MEMORY = 3

KERNELS_HELP = (
    "Measured costs: a table directory, a shipped table's name, 'auto' (the shipped table of the cluster's GPU, "
    "the default) or 'none' (the pure model)."
)


def with_kernels(s: Scenario, kernels: str | None) -> Scenario:
    """The scenario with ``--kernels`` applied (a directory is relative to the working directory)."""
    if kernels is None:
        return s
    return s.model_copy(update={"kernels": check_choice(kernels, "--kernels")})
