"""Which fabric a path's links belong to, and the frame bytes a schedule puts on each (no root)."""
from __future__ import annotations

from pathlib import Path

import pytest

from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import fabricmap, roce, schedule as sch
from labctl.traffic.pool import gpu_ranks

ROOT = Path(__file__).resolve().parents[1]


def plan_of(name: str, *sets: str):
    return compile_plan(load_topology(ROOT / "topologies" / name, sets=sets))


def test_frame_bytes_count_every_header_of_every_packet():
    # 1 MiB at RoCE MTU 4096: 256 packets of 58 header bytes, a RETH on the first, an immediate on the last
    assert fabricmap.frame_bytes(1 << 20, 9000) == (1 << 20) + 256 * roce.FRAME_OVERHEAD + 16 + 4
    assert fabricmap.frame_bytes(100, 9000) == 100 + roce.FRAME_OVERHEAD + 16 + 4     # WRITE_ONLY_IMM
    assert fabricmap.frame_bytes(3000, 1500) == 3000 + 3 * roce.FRAME_OVERHEAD + 20   # 1024-byte RoCE MTU


def test_leaf_spine_paths_cross_nvlink_inside_a_server_and_four_backend_links_across():
    plan = plan_of("leaf-spine.yml")
    fm, nodes = fabricmap.FabricMap(plan), gpu_ranks(plan)
    assert fm.hops(nodes[0], nodes[1]) == {"scaleup": 2, "scaleout": 0, "scaleacross": 0, "frontend": 0}
    assert fm.hops(nodes[0], nodes[4]) == {"scaleup": 0, "scaleout": 2, "scaleacross": 0, "frontend": 0}  # one rail leaf
    assert fm.hops(nodes[0], nodes[7]) == {"scaleup": 0, "scaleout": 4, "scaleacross": 0, "frontend": 0}
    assert fm.island(nodes[0]) == fm.island(nodes[3]) != fm.island(nodes[4])


def test_two_zone_path_crosses_the_wan_once():
    plan = plan_of("ai-cluster.yml", "zones=2")
    fm, nodes = fabricmap.FabricMap(plan), gpu_ranks(plan)
    z1, z2 = nodes[0], nodes[15]
    assert (z1.zone, z2.zone) == ("z1", "z2")
    assert fm.hops(z1, z2) == {"scaleup": 0, "scaleout": 6, "scaleacross": 1, "frontend": 0}


def test_expected_bytes_of_a_ring_all_reduce_follow_its_hops():
    plan = plan_of("leaf-spine.yml")
    fm, nodes = fabricmap.FabricMap(plan), gpu_ranks(plan)
    ranks, size = sorted(nodes), 8 << 20
    s = sch.ring_all_reduce(ranks, size)
    got = fm.expected(s.transfers, nodes)
    # each of the 8 ring hops carries 2(n-1) chunks of size/n in 512 KiB slices: 6 hops inside a
    # server (2 NVLink links each), 2 across (4 backend links each, srv1-gpu3 -> srv2-gpu0 and back)
    per_hop = 2 * 7 * sum(fabricmap.frame_bytes(x, 9000) for x in sch.slices(size // 8, sch.DEFAULT_SLICE))
    assert got == {"scaleup": 6 * 2 * per_hop, "scaleout": 2 * 4 * per_hop, "scaleacross": 0, "frontend": 0}


def test_compare_flags_a_fabric_off_by_more_than_two_percent():
    c = fabricmap.compare({"scaleup": 103, "scaleout": 100}, {"scaleup": 100, "scaleout": 100})
    assert not c["scaleup"]["agrees"] and c["scaleout"]["agrees"]
    c = fabricmap.compare({"scaleup": 1000, "scaleout": 50}, {"scaleup": 1000})
    assert not c["scaleout"]["agrees"]       # bytes where none were expected


def test_an_nvl72_rack_is_one_island_across_its_servers_and_nvlink_5_is_the_default():
    plan = plan_of("leaf-spine.yml", "servers=18", "scaleup_gpus=72", "dilation=32000")
    fm, nodes = fabricmap.FabricMap(plan), gpu_ranks(plan)
    assert len(nodes) == 72 and len({fm.island(n) for n in nodes.values()}) == 1
    assert fm.hops(nodes[0], nodes[71]) == {"scaleup": 2, "scaleout": 0, "scaleacross": 0, "frontend": 0}
    nvl = [lk for lk in plan.links if lk.fabric == "nvlink"]
    assert len(nvl) == 72 and {lk.rate_bps for lk in nvl} == {7200 * 10**9}      # 900 GB/s one way
    n4 = plan_of("leaf-spine.yml", "nvlink=4")
    assert {lk.rate_bps for lk in n4.links if lk.fabric == "nvlink"} == {3600 * 10**9}


def test_a_1024_gpu_nvlink_domain_plans():
    plan = plan_of("leaf-spine.yml", "servers=256", "scaleup_gpus=1024", "leaves=8", "spines=4", "dilation=32000")
    fm, nodes = fabricmap.FabricMap(plan), gpu_ranks(plan)
    assert len(nodes) == 1024
    assert [n.name for n in plan.nodes if n.kind == "nvswitch"] == ["nvl1-nvs"]
    assert fm.hops(nodes[0], nodes[1023])["scaleup"] == 2


@pytest.mark.parametrize("sets", [("scaleup_gpus=6",), ("scaleup_gpus=2",), ("servers=3", "scaleup_gpus=8")])
def test_nvlink_domains_that_do_not_fit_the_servers_are_refused(sets):
    from labctl.errors import InputError
    with pytest.raises(InputError):
        plan_of("leaf-spine.yml", *sets)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 72])
def test_double_binary_tree_sends_what_its_formula_gives(n):
    from labctl.traffic import algorithms
    size = 4 << 20
    s = algorithms.tree_all_reduce(list(range(n)), size)
    sent = s.bytes_sent()
    formula = algorithms.tree_bytes_per_rank(n, size)
    for p in range(n):
        assert abs(sent[p] - formula[p]) <= 0.01 * formula[p]
    # on average 2(n-1)/n x S per rank, as a ring; no rank sends more than 2 S
    assert sum(formula) == pytest.approx(2 * (n - 1) * size, rel=1e-6) and max(formula) <= 2 * size
    for parents in algorithms.dtree_parents(n):
        assert parents.count(-1) == 1
    if n > 2:       # an interior rank of one tree is a leaf of the other
        t0, t1 = algorithms.dtree_parents(n)
        interior = [{p for p in t if p >= 0} for t in (t0, t1)]
        assert len(interior[0] & interior[1]) <= 1


def test_ring_sends_2_n_minus_1_over_n():
    s = sch.ring_all_reduce(list(range(8)), 8 << 20)
    assert set(s.bytes_sent().values()) == {2 * 7 * (8 << 20) // 8}


def test_auto_picks_hier_across_nvlink_islands_and_tree_for_small_flat_all_reduces():
    from labctl.traffic import algorithms
    plan = plan_of("leaf-spine.yml")
    ranks = sorted(gpu_ranks(plan))
    assert algorithms.choose(plan, ranks, 64 << 20, sch.DEFAULT_SLICE, 1, 0) == "hier"
    flat = plan_of("leaf-spine.yml", "scale_up=false", "servers=8")
    r = sorted(gpu_ranks(flat))
    assert algorithms.choose(flat, r, 64 << 10, 4096, 1, 14000) == "tree"     # latency-bound
    # bandwidth alone: a ring's busiest NIC moves 2(n-1)/n S, a tree's interior rank 2 S
    assert algorithms.choose(flat, r, 8 << 20, sch.DEFAULT_SLICE, 1, 0) == "ring"


def test_fabric_load_plot_sums_each_fabrics_ports(tmp_path):
    from labctl.experiment import plots
    plan = plan_of("leaf-spine.yml")
    head = "t_s,node,port,class,tc,depth_bytes,sent_bytes,sent_packets,drops,ecn_marked,pfc_tx,pfc_rx,paused_s\n"
    nv = plan.node("srv1-gpu0").interfaces
    nvl = next(i for i in nv if i.fabric == "nvlink").name
    be = next(i for i in nv if i.fabric == "backend").name
    rows = [f"0.0,srv1-gpu0,{nvl},roce,3,0,0,0,0,0,0,0,0", f"0.5,srv1-gpu0,{nvl},roce,3,0,1000000,1,0,0,0,0,0",
            f"0.0,srv1-gpu0,{be},roce,3,0,0,0,0,0,0,0,0", f"0.5,srv1-gpu0,{be},roce,3,0,250000,1,0,0,0,0,0"]
    (tmp_path / "queues.csv").write_text(head + "\n".join(rows) + "\n")
    s = plots.fabric_load(tmp_path, plan, tmp_path / "f.png")
    assert sum(s["scaleup"][1]) * 0.1 / 8 * 1e6 == pytest.approx(1_000_000)
    assert sum(s["scaleout"][1]) * 0.1 / 8 * 1e6 == pytest.approx(250_000)
    assert (tmp_path / "f.png").stat().st_size > 0


def test_an_algorithm_on_a_ring_only_collective_is_a_located_error(tmp_path):
    from labctl.errors import InputError
    from labctl.traffic.workload import load_workload
    f = tmp_path / "w.yml"
    f.write_text("name: x\ncollective: all_gather\nalgorithm: tree\nsizes: [1MB]\n")
    with pytest.raises(InputError) as e:
        load_workload(f)
    assert e.value.where.line == 3 and "applies to collective: all_reduce" in str(e.value)


def test_the_per_operation_plots_draw_the_longest_operation(tmp_path):
    """User trial: a step's timeline and sender rates drew its first operation, a 1 s forward
    all-gather, not the 21 s backward pass where the WAN dropped and DCQCN reacted."""
    import json
    from labctl.experiment import plots

    def op(label, length):
        sends = [[k, k * length / 8, (k + 1) * length / 8] for k in range(8)]
        return {"label": label, "time_s": length,
                "per_rank": {"0": {"sends": sends, "bytes_sent": 8000}, "1": {"sends": sends, "bytes_sent": 8000}}}
    doc = {"results": [op("forward all_gather layer 0", 1.0), op("backward + replica all_reduce", 21.0)],
           "nodes": {"0": "g0", "1": "g1"}}
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert plots.longest(doc["results"]) == 1
    rates = plots.sender_rates(tmp_path, tmp_path / "r.png")
    assert max(rates["rank 0"][0]) >= 20.0
    gantt = plots.timeline(tmp_path, tmp_path / "t.png")
    assert max(gantt["rank 0"][0]) >= 18.0
    assert max(plots.timeline(tmp_path, tmp_path / "t0.png", result=0)["rank 0"][0]) < 1.0
