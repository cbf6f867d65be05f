"""What the command modules share: exit statuses and the ``--kernels`` option."""

from typing import TYPE_CHECKING

from simulator.errors import ScenarioError

if TYPE_CHECKING:  # the command modules import the simulator when a command runs, not for --help
    from simulator.scenario.schema import Scenario

# Exit status: 0 = simulated and fits; 2 = bad input (one line on stderr naming the field); 3 = simulated, but the
# run (compare: any of its runs) does not fit in GPU (or, offloading, host) memory; validate: 1 = a case failed
# or the --check gate missed.
EXIT_OUT_OF_MEMORY = 3

KERNELS_HELP = (
    "Measured costs: a table directory (layered over the shipped table of the cluster's GPU), a shipped table's "
    "name, 'auto' (the shipped table of the cluster's GPU, the default) or 'none' (the pure model)."
)


KERNELS_ONLY_HELP = "A table directory alone, without the shipped table of the GPU beneath it."


def with_kernels(s: "Scenario", kernels: str | None, kernels_only: str | None = None) -> "Scenario":
    """The scenario with ``--kernels`` (a table directory layered over the GPU's shipped table) or
    ``--kernels-only`` (the directory alone) applied; a directory is relative to the working directory."""
    from simulator.tables.select import check_choice

    if kernels is not None and kernels_only is not None:
        raise ScenarioError("--kernels and --kernels-only: give one of them")
    if kernels_only is not None:
        return s.model_copy(
            update={"kernels": check_choice(kernels_only, "--kernels-only"), "kernels_only": True}
        )
    if kernels is None:
        return s
    return s.model_copy(update={"kernels": check_choice(kernels, "--kernels"), "kernels_only": False})


FRAMEWORK_HELP = (
    "Framework profile: a shipped name (megatron-core-2024, pytorch-2024, ...) or a profile file of your own (clustersim "
    "calibrate profile --write), replacing the scenario's framework:."
)
TOKENS_HELP = "Tokens the whole training run sees (15T, 300B or a number): days, GPU-hours and cost to train."
PRICE_HELP = "US dollars per GPU-hour, for the cost to train (with --tokens or training.total_tokens)."


def with_goal(s: "Scenario", tokens: str | None, price: float | None) -> "Scenario":
    """The scenario with ``--tokens`` and ``--price`` applied (checked as the scenario's own fields are)."""
    from pydantic import ValidationError

    from simulator.scenario.schema import Scenario

    if tokens is None and price is None:
        return s
    data = s.model_dump()
    if tokens is not None:
        data["training"]["total_tokens"] = tokens
    if price is not None:
        data["cluster"]["price_per_gpu_hour"] = price
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        what = "--tokens" if tokens is not None and "total_tokens" in str(e) else "--price"
        reason = e.errors()[0]["msg"].removeprefix("Value error, ")
        raise ScenarioError(f"{what}: {reason}") from None
