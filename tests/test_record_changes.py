"""Commands that change a running lab (`labctl tc set --rate`, `labctl lb`) each hold a plan they
read earlier; each writes its change into the record as it is now, under the state lock, so that
neither undoes the other. Pure files: a lab's record without its namespaces."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from labctl import state
from labctl.lifecycle.labs import change_record, load_plan
from labctl.plan import qos
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology

LEAF_SPINE = Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"


def test_two_commands_with_stale_plans_both_reach_the_record(state_dir):
    plan = compile_plan(load_topology(LEAF_SPINE, sets=["lb=ecmp"]))     # its routers run the lb program
    lab = state.claim(plan.lab, plan.to_dict(), None)

    def slower(p):
        port = p.node("leaf1").iface("spine1")
        port.shaping = qos.reshaped(port.shaping, 10_000_000)
    change_record(lab, "tc set", slower)
    gap = plan.node("leaf2").flow_hash.gap_ns + 1      # from the plan `lb` read before `tc set` wrote

    def flowlet(p):
        p.node("leaf2").flow_hash = dataclasses.replace(p.node("leaf2").flow_hash, gap_ns=gap)
    change_record(lab, "lb", flowlet)
    recorded = load_plan(lab)
    assert recorded.node("leaf1").iface("spine1").shaping.rate_bps == 10_000_000, "the first change was kept"
    assert recorded.node("leaf2").flow_hash.gap_ns == gap
    assert recorded.node("leaf3").iface("spine1").shaping == plan.node("leaf3").iface("spine1").shaping
