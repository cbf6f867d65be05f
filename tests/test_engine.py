"""The engine replays programs; the fluid network shares links between overlapping transfers."""

import pytest
import simpy

from simulator.costs.collectives import Phase
from simulator.engine.engine import DeadlockError, simulate_program
from simulator.engine.network import FluidNetwork
from simulator.program import Program


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


def test_compute_planned_ahead_and_collectives_in_simulated_time_agree():
    """Compute streams are planned without events (their ends are fixed); a collective that depends on a
    compute task planned for later waits until then, and contends with another collective on the link.

    rank 0: a (2 s) -> collective c1 (1 s of link "x" alone)
    rank 1: b (1 s) -> collective c2 (1 s of "x"): alone from 1 to 2, ends as c1 starts
            d (0.5 s) after c2 and a; then on a mixed stream e (0.25 s) and collective f (1 s of "x")
    c1 runs alone 2 -> 2.75 (0.75 done), shares x with f until it ends at 3.25; f then finishes alone at 4."""
    p = Program("test")
    a = p.add(0, "compute", "forward", "forward", "a", ops=())
    b = p.add(1, "compute", "forward", "forward", "b", ops=())
    c1 = p.add(0, "comm", "all_reduce", "backward", "c1", (a,), group="dp", bytes=1)
    c2 = p.add(1, "comm", "all_reduce", "backward", "c2", (b,), group="dp", bytes=1)
    d = p.add(1, "compute", "forward", "forward", "d", (c2, a), ops=())
    e = p.add(1, "mixed", "forward", "forward", "e", (d,), ops=())
    f = p.add(1, "mixed", "all_reduce", "backward", "f", (e,), group="dp", bytes=1)
    seconds = {"a": 2.0, "b": 1.0, "d": 0.5, "e": 0.25}
    tl = simulate_program(p, lambda t: (seconds[t.name], ()), lambda t: [Phase(0.0, {"x": 1.0})])
    assert (tl.start[c2], tl.end[c2]) == pytest.approx((1.0, 2.0))
    assert (tl.start[c1], tl.end[c1]) == pytest.approx((2.0, 3.25))
    assert (tl.start[d], tl.end[d]) == pytest.approx((2.0, 2.5))  # waits for c2 (2.0) and a (2.0)
    assert (tl.start[e], tl.end[e]) == pytest.approx((2.5, 2.75))
    assert (tl.start[f], tl.end[f]) == pytest.approx((2.75, 4.0))
