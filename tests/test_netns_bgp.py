"""The BGP leaf-spine (topologies/leaf-spine-bgp.yml): FRR in a container on every switch, eBGP as
RFC 7938 builds it, BFD on every fabric link. Every session is Established, every pair pings, ECMP
spreads source ports over both spines, a cut leaf uplink reconverges within the budget with every
pair reachable, the restored link comes back into the ECMP set, and PFC keeps the incast lossless."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import lab_namespaces, module_state_dir
from netutil import wait_for
from labctl import lifecycle as labmod
from labctl.lifecycle import convergence
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload
from test_netns_lossless import assert_lossless

ROOT = Path(__file__).resolve().parents[1]
BGP_LAB = ROOT / "topologies" / "leaf-spine-bgp.yml"
pytestmark = pytest.mark.netns
# BFD detects a silent failure in 3 x 100 ms; a carrier loss is seen at once, and the withdrawals
# then cross one spine and reach every leaf: 1 s of lab time is three BFD budgets on 2 busy cores
CUT_BUDGET_S = 1.0
SPORTS = range(49152, 49168)
BFD_UP_S = 10


@pytest.fixture(scope="module")
def bgp_lab(docker_engine, tmp_path_factory):
    import uuid
    name = f"lt{uuid.uuid4().hex[:6]}"
    with module_state_dir(tmp_path_factory):
        try:
            plan, lab, _ = labmod.up(str(BGP_LAB), name=name)
            yield plan, lab
        finally:
            if _exists(name):
                labmod.down(name)
            assert lab_namespaces(name + "-") == []
            assert docker_engine.containers.list(all=True, filters={"label": f"labctl.lab={name}"},
                                                 ignore_removed=True) == []


def _exists(name: str) -> bool:
    from labctl import state
    return state.lab_dir(name).path.exists()


def vtysh_json(plan, lab, node: str, command: str) -> dict:
    argv = labmod.backend_of(lab).exec_argv(plan.node(node), ["vtysh", "-c", command])
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def test_every_switch_has_its_sessions_established(bgp_lab):
    plan, lab = bgp_lab
    switches = [n for n in plan.nodes if n.container and n.kind == "switch"]
    assert len(switches) == 6 and all(not n.routes for n in switches), "FRR routes them, not labctl"
    for n in switches:
        peers = vtysh_json(plan, lab, n.name, "show bgp summary json")["ipv4Unicast"]["peers"]
        wanted = {i.peer_address for i in n.interfaces if plan.node(i.peer_node).kind == "switch"}
        assert set(peers) == wanted and all(p["state"] == "Established" for p in peers.values()), (n.name, peers)
        # BFD comes up a little after the BGP sessions it protects (the routes need only BGP): within a
        # few of its 100 ms intervals, so up to BFD_UP_S
        up = lambda: {p["peer"] for p in vtysh_json(plan, lab, n.name, "show bfd peers json")  # noqa: E731
                      if p["status"] == "up"}
        assert wait_for(lambda: up() == wanted, timeout=BFD_UP_S, step=0.1), (n.name, up())


def test_pingall_and_ecmp_across_both_spines(bgp_lab):
    plan, lab = bgp_lab
    assert labmod.pingall(plan) == (80, [])
    spines = {labmod.trace_path(plan, "srv1-gpu0", "srv2-gpu1", sport, 4791)[1]["out"] for sport in SPORTS}
    assert spines == {"spine1", "spine2"}


def test_a_cut_uplink_reconverges_within_budget_and_comes_back(bgp_lab):
    plan, lab = bgp_lab
    leaf1 = plan.node("leaf1")
    for attempt in range(3):
        t0 = time.monotonic()
        labmod.set_link_state(lab, plan, leaf1, "spine1", up=False)
        took = labmod.converge_after_link_change(lab, plan, t0)
        assert took is not None and took < CUT_BUDGET_S, f"cut {attempt}: converged after {took:.3f} s"
        routes = subprocess.run(["ip", "-n", leaf1.namespace, "route"], capture_output=True, text=True).stdout
        assert "dev spine1" not in routes.split("proto kernel")[-1]
        assert labmod.pingall(plan) == (80, [])
        t0 = time.monotonic()
        labmod.set_link_state(lab, plan, leaf1, "spine1", up=True)
        assert labmod.converge_after_link_change(lab, plan, t0) is not None
        assert convergence.missing(plan) == {}, "the restored uplink is back in every ECMP set"
        assert labmod.pingall(plan) == (80, [])


@pytest.mark.solo
def test_pfc_keeps_the_incast_lossless_on_the_bgp_fabric(bgp_lab, tmp_path):
    plan, lab = bgp_lab
    for k in range(3):
        assert_lossless(run_workload(plan, lab, load_workload(ROOT / "workloads" / "incast.yml"), tmp_path / f"{k}"),
                        lab=lab)
