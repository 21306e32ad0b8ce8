"""The agent pool's pure logic (no root): collecting answers, and how long a waiting rank may hear
nothing before a chain of transfers reaches it."""
import queue
from pathlib import Path

import pytest

from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import schedule as sch
from labctl.traffic.bound import bound_parts, chain_seconds
from labctl.traffic.pool import AgentPool, gpu_ranks, quiet_floor
from labctl.traffic.run import QUIET_FACTOR, time_outs

ROOT = Path(__file__).resolve().parents[1]


def test_a_traffic_agent_that_answered_and_ended_does_not_spoil_the_others_answers():
    """On `exit` each traffic agent writes its counters and ends; another, slower rank may still be
    writing its own. Its end must not be taken for a rank that failed to answer: that once
    dropped every rank's counters, and the run reported nothing sent and nothing received."""
    pool = AgentPool.__new__(AgentPool)
    pool.ranks = [0, 1]
    pool.events = queue.Queue()
    for event in [(0, {"event": "counters", "tx": [1]}), (0, {"event": "exited", "code": 0}),
                  (1, {"event": "counters", "tx": [2]})]:
        pool.events.put(event)
    got = pool._collect("counters", 2, timeout=1)
    assert {r: m["tx"] for r, m in got.items()} == {0: [1], 1: [2]}
    # an agent that ends before it answers is still an error, naming it
    pool.events.put((1, {"event": "exited", "code": 1}))
    with pytest.raises(Exception, match="rank 1 exited"):
        pool._collect("counters", 2, timeout=1)


def test_a_pipelined_broadcast_of_one_slice_is_bound_by_its_chain():
    """8 ranks over the fabric, one 16 MB slice: each rank forwards the whole message once it has
    it, so the last rank hears nothing for 7 transfers of 16 MB in series. The busiest port sends
    it once; the bound is the chain (its serial_s: six sends more), and the silence allowed a
    waiting rank outlasts it."""
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets=["scale_up=false"]))
    nodes = gpu_ranks(plan)
    ranks = sorted(nodes)
    s = sch.broadcast(ranks, 16 << 20, 16 << 20)
    parts = bound_parts(plan, s, nodes)
    one = parts["bandwidth_s"]
    assert parts["total_s"] == pytest.approx(7 * one, rel=0.01), parts
    assert parts["serial_s"] == pytest.approx(6 * one, rel=0.01) and parts["propagation_s"] == 0.0, parts
    chain = chain_seconds(plan, s, nodes)
    assert chain == pytest.approx(parts["total_s"], rel=1e-9)
    _, quiet = time_outs(None, parts["total_s"], max(quiet_floor(plan), QUIET_FACTOR * chain))
    assert quiet > chain > quiet_floor(plan)     # the floor alone would cut rank 7 off


def _one_way(plan, nodes, a, b) -> float:
    from labctl.traffic.fabricmap import for_plan
    return for_plan(plan).delay_s(nodes[a], nodes[b])


def test_a_sliced_ring_across_a_wan_pays_the_distance_once_at_its_busiest_port():
    """The bundled two-zone lab, 10 km of WAN (196 ms one way at dilation 4000). 8 MB: each step's
    1 MB is two 512 KB slices, and the slices going round overlap the distance with sending: the
    run cannot end before the WAN port has sent its bytes and its last slice has crossed, one
    one-way delay after. The bound adds that, not the chain's four crossings (a run once finished
    in 0.85 of a bound that added them). 1 MB: 128 KB a step, one slice, nothing overlaps: the
    chain crosses the WAN four times in series and the bound is that chain."""
    plan = compile_plan(load_topology(ROOT / "topologies" / "scale-across.yml", sets=[]))
    nodes = gpu_ranks(plan)
    ranks = sorted(nodes)
    delay = max(_one_way(plan, nodes, a, b) for a in ranks for b in ranks if a != b)
    assert delay == pytest.approx(0.196, rel=0.01)
    big = bound_parts(plan, sch.ring_all_reduce(ranks, 8 << 20, 512 << 10), nodes)
    assert big["propagation_s"] == pytest.approx(delay, rel=0.01), big
    assert big["total_s"] == pytest.approx(big["bandwidth_s"] + delay, rel=0.01), big
    small = bound_parts(plan, sch.ring_all_reduce(ranks, 1 << 20, 512 << 10), nodes)
    assert small["propagation_s"] == pytest.approx(4 * delay, rel=0.02), small
    assert small["total_s"] == pytest.approx(chain_seconds(plan, sch.ring_all_reduce(ranks, 1 << 20, 512 << 10), nodes))


def test_a_transfer_that_waits_for_one_made_after_it_is_still_waited_for():
    """Dependencies are walked in topological order, not by id: a training step makes its
    pipeline sends first and gives them `after` entries that point at transfers made later."""
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets=["scale_up=false"]))
    nodes = gpu_ranks(plan)
    a, b, c = sorted(nodes)[:3]
    later_first = sch.Schedule("x", [a, b, c], 0, [sch.Transfer(0, b, c, 1 << 20, (1,), "x", 1),
                                                   sch.Transfer(1, a, b, 1 << 20, (), "x", 0)])
    one = bound_parts(plan, sch.Schedule("x", [a, b], 0, [sch.Transfer(1, a, b, 1 << 20, (), "x", 0)]),
                      nodes)["total_s"]
    assert chain_seconds(plan, later_first, nodes) == pytest.approx(2 * one, rel=0.01)
    assert bound_parts(plan, later_first, nodes)["total_s"] == pytest.approx(2 * one, rel=0.01)


def test_a_ring_all_reduce_chain_is_its_steps():
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets=["scale_up=false"]))
    nodes = gpu_ranks(plan)
    s = sch.ring_all_reduce(sorted(nodes), 8 << 20)
    # 2 (n - 1) steps of one slice each along the ring: within a step the bound's bytes, in series
    assert chain_seconds(plan, s, nodes) < 1.2 * bound_parts(plan, s, nodes)["total_s"]


def test_a_path_trace_that_fails_after_the_run_is_a_note_not_a_lost_run(tmp_path):
    """The ring's paths are traced after the run, on the lab as it is then: a link taken down
    during the run can leave a destination unroutable. The run's results stand, with a note
    saying the paths were not traced (it once ended `labctl run` with an error and no results)."""
    from labctl.errors import LabError
    from labctl.traffic.placement import traced
    from labctl.traffic.run import build_ops, participants
    from labctl.traffic.workload import load_workload
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets=["scale_up=false"]))
    wf = tmp_path / "ar.yml"
    wf.write_text("name: ar\ncollective: all_reduce\nsizes: [1MB]\n")
    loaded = load_workload(wf)
    ranks = participants(plan, loaded)
    ops = build_ops(plan, loaded, ranks)

    def unroutable(*args, **kwargs):
        raise LabError("leaf1 cannot route to 10.1.0.16: Network is unreachable")
    out = traced(plan, unroutable, loaded.workload, [op.schedule for op in ops[:1]], ranks)
    assert "ring_placement" not in out and "fabric_paths" not in out, out
    assert out["trace_error"].startswith("the ring's paths were not traced after the run (leaf1 cannot route"), out


def test_a_victim_beside_the_collective_is_not_in_its_bound():
    """congestion-spreading's victim runs beside the incast and is timed apart: its bytes in the
    bound made the collective's bound 2.27 s where the collective alone can finish in 1.62."""
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets=["scale_up=false"]))
    nodes = gpu_ranks(plan)
    a, b, c, d = sorted(nodes)[:4]
    ring = sch.ring_all_reduce([a, b, c], 3 << 20, 512 << 10)
    victim = sch.Transfer(10_000, d, a, 8 << 20, (), "victim", 0)
    beside = sch.Schedule(ring.collective, ring.ranks, ring.size, ring.transfers + [victim], ring.algorithm)
    assert bound_parts(plan, beside, nodes) == bound_parts(plan, ring, nodes)
