"""clustersim: a discrete-event simulator of GPU clusters training large language models."""

from simulator.api import Result, simulate
from simulator.errors import ScenarioError
from simulator.scenario.loader import load_scenario

__all__ = ["Result", "ScenarioError", "load_scenario", "simulate"]
__version__ = "0.1.0"
