"""clustersim: a discrete-event simulator of GPU clusters training large language models.

``from simulator import load_scenario, simulate`` imports the simulator where it is first used (PEP 562), so
``import simulator.cli`` can make its own imports first, under its own rules (``simulator/cli/__init__.py``)."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.api import Result, simulate
    from simulator.errors import ScenarioError
    from simulator.scenario.loader import load_scenario

__all__ = ["Result", "ScenarioError", "load_scenario", "simulate"]
__version__ = "0.1.0"

_HOMES = {
    "Result": "simulator.api",
    "simulate": "simulator.api",
    "ScenarioError": "simulator.errors",
    "load_scenario": "simulator.scenario.loader",
}


def __getattr__(name: str):
    if name in _HOMES:
        from importlib import import_module

        value = getattr(import_module(_HOMES[name]), name)
        globals()[name] = value  # found once
        return value
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
