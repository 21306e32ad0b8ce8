"""The agent pool's pure logic (no root): collecting answers, and how long a waiting rank may hear
nothing before a chain of transfers reaches it."""
import queue
from pathlib import Path

import pytest

from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import schedule as sch
from labctl.traffic.pool import AgentPool, bound_parts, chain_seconds, gpu_ranks, quiet_floor
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


def test_a_pipelined_broadcast_waits_its_chain_not_its_bound():
    """8 ranks over the fabric, one 16 MB slice: each rank forwards the whole message once it has
    it, so the last rank hears nothing for 7 transfers of 16 MB. The α-β bound counts the busiest
    port (one 16 MB send); the silence allowed must outlast the chain."""
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets=["scale_up=false"]))
    nodes = gpu_ranks(plan)
    ranks = sorted(nodes)
    s = sch.broadcast(ranks, 16 << 20, 16 << 20)
    ideal = bound_parts(plan, s, nodes)["total_s"]
    chain = chain_seconds(plan, s, nodes)
    assert chain == pytest.approx(7 * ideal, rel=0.05)       # 7 store-and-forward hops of one 16 MB send
    _, quiet = time_outs(None, ideal, max(quiet_floor(plan), QUIET_FACTOR * chain))
    assert quiet > chain > quiet_floor(plan) > 2 * ideal     # the floor alone would cut rank 7 off


def test_a_ring_all_reduce_chain_is_its_steps():
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", sets=["scale_up=false"]))
    nodes = gpu_ranks(plan)
    s = sch.ring_all_reduce(sorted(nodes), 8 << 20)
    # 2 (n - 1) steps of one slice each along the ring: within a step the bound's bytes, in series
    assert chain_seconds(plan, s, nodes) < 1.2 * bound_parts(plan, s, nodes)["total_s"]
