"""The engine replays programs; the fluid network shares links between overlapping transfers."""

import pytest
import simpy

from simulator.costs.collectives import Phase
from simulator.engine.engine import DeadlockError, simulate_program
from simulator.engine.network import FluidNetwork
from simulator.strategy.program import Program


def run_transfers(specs):
    """specs: (start_s, demand) -> finish times."""
    env = simpy.Environment()
    net = FluidNetwork(env)
    finish = {}

    def proc(i, start, demand):
        yield env.timeout(start)
        yield net.transfer(demand)
        finish[i] = env.now

    for i, (start, demand) in enumerate(specs):
        env.process(proc(i, start, demand))
    env.run()
    return [finish[i] for i in range(len(specs))]


def test_two_equal_transfers_on_one_nic_each_take_twice_as_long():
    assert run_transfers([(0, {"nic": 1.0}), (0, {"nic": 1.0})]) == pytest.approx([2.0, 2.0])


def test_transfers_on_different_links_do_not_slow_each_other():
    assert run_transfers([(0, {"nic": 1.0}), (0, {"nvlink": 1.0})]) == pytest.approx([1.0, 1.0])


def test_a_late_transfer_shares_only_while_both_run():
    # A alone for 0.5 s (half done), then both at half speed: A needs 1 s more, B then finishes alone.
    assert run_transfers([(0, {"nic": 1.0}), (0.5, {"nic": 1.0})]) == pytest.approx([1.5, 2.0])


def test_speeds_relative_to_running_alone_rise_together_until_a_link_is_full():
    # On the NIC, A needs 1.0 and B 0.1 per second of full speed: both run at 1/1.1 of full speed.
    assert run_transfers([(0, {"nic": 1.0}), (0, {"nic": 0.1, "pcie": 1.0})]) == pytest.approx([1.1, 1.1])
    # C shares B's PCIe: the PCIe fills first (B and C at half speed), A then takes the NIC left over (0.95).
    abc = run_transfers([(0, {"nic": 1.0}), (0, {"nic": 0.1, "pcie": 1.0}), (0, {"pcie": 1.0})])
    assert abc == pytest.approx([1 / 0.95, 2.0, 2.0])


def test_stream_order_and_dependencies():
    p = Program("test")
    a = p.add(0, "compute", "forward", "forward", "a", ops=())
    c = p.add(0, "comm", "all_reduce", "backward", "c", (a,), group="dp", bytes=1)
    p.add(0, "compute", "optimizer", "optimizer", "b", (c,), ops=())

    tl = simulate_program(p, lambda t: ({"a": 1.0, "b": 0.5}[t.name], ()), lambda t: [Phase(2.0, {"x": 1.0})])
    assert list(tl.start) == [0.0, 1.0, 4.0]
    assert list(tl.end) == [1.0, 4.0, 4.5]
    assert tl.blocker[2] == c


def test_a_cycle_is_reported_not_hung():
    p = Program("test")
    p.add(0, "s1", "forward", "forward", "a", (1,), ops=())
    p.add(0, "s2", "forward", "forward", "b", (0,), ops=())
    with pytest.raises(DeadlockError, match="never ran"):
        simulate_program(p, lambda t: (1.0, ()), lambda t: [])
