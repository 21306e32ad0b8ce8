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
