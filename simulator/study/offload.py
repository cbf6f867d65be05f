"""ZeRO-Offload in the plan's screen: the host work of a layout whose optimizer runs on the CPU, costed by the
simulation's own host model (``costs/host.py``) on one node whose GPUs all copy and step alike, as the strategy
schedules it (``strategy/offload.py``): each micro-batch's reduced gradient partition copied to host memory
beside backward, then the CPU step over the rank's partition (the node's CPU shared by its GPUs), then the updated
16-bit partition back to the GPU before the weights' all-gather."""

from __future__ import annotations

from simulator.costs.collectives import CollectiveModel
from simulator.costs.host import HostModel
from simulator.hardware.cluster import Cluster
from simulator.hardware.placement import Placement
from simulator.hardware.topology import TopologySpec
from simulator.scenario.schema import Scenario
from simulator.strategy.state_bytes import grad_bytes, weight_bytes


class OffloadScreen:
    def __init__(self, spec: TopologySpec):
        self.spec = spec
        self._host: HostModel | None = None

    def host(self, s: Scenario) -> HostModel:
        """The host model of one node, every GPU a data-parallel rank (built once, from the first offloaded
        layout's scenario: the offload settings are the plan's, the same for all)."""
        if self._host is None:
            one = Cluster(self.spec, 1)
            self._host = HostModel(CollectiveModel(one, Placement(dp=one.gpus_per_node)), s)
        return self._host

    def exposed_s(
        self, s: Scenario, params: float, microbatches: int, backward_s: float, held: float | None = None
    ) -> float:
        """Seconds ZeRO-Offload adds to an iteration for a rank optimizing ``params`` parameters: the gradient
        copies past each micro-batch's backward (``backward_s``), the CPU step and the weights' way back.
        ``held``: DeepSpeed ZeRO-3's reduce-scatters of one micro-batch, which at the accumulation boundary hold
        the host bucket by bucket until each is reduced and copied (strategy/sharded.py): the last micro-batch's
        copies and reductions are all exposed."""
        host = self.host(s)
        to_host = host.standalone_time_s("d2h", "host", params * grad_bytes(s))
        step = host.standalone_time_s("cpu_optimizer", "host", params)
        back = host.standalone_time_s("h2d", "host", params * weight_bytes(s))
        if held is None:
            return microbatches * max(0.0, to_host - backward_s) + step + back
        return (microbatches - 1) * max(0.0, to_host - backward_s) + held + to_host + step + back
