"""The WAN's model, without root: bandwidth-delay product against buffer and distance."""
from __future__ import annotations

from pathlib import Path

import pytest

from labctl.plan import qos


def test_the_bdp_passes_a_2mb_buffer_at_about_4_1_km_at_400g():
    """wan-distance's break-even: 2 MB x 8 / 400 Gbit/s = 40 us round trip = 20 us one way = 4.08 km."""
    km = qos.bdp_distance_m(2_000_000, 400 * 10**9) / 1000
    assert km == pytest.approx(4.08, abs=0.01)
    assert qos.bdp_bytes(400 * 10**9, int(km * 4900)) == pytest.approx(2_000_000, rel=1e-3)


def test_wan_metrics_split_the_dci_wan_queues_from_the_zones():
    from types import SimpleNamespace as NS
    from labctl.experiment.wan import wan_metrics
    link = lambda i, wired: NS(id=i, wire=object() if wired else None)
    port = lambda name, lk: NS(name=name, link=lk)
    plan = NS(links=[link(0, False), link(1, True)],
              nodes=[NS(name="spine", interfaces=[port("dci", 0)]),
                     NS(name="dci", interfaces=[port("spine", 0), port("wan", 1)])])
    d = lambda depth, drops, pfc: {"max_depth": depth, "drops": drops, "pfc_tx": pfc}
    deltas = {("dci", "wan", "roce"): d(3_000_000, 7, 0), ("dci", "wan", "default"): d(10, 1, 0),
              ("spine", "dci", "roce"): d(900_000, 0, 40), ("dci", "spine", "roce"): d(5, 0, 2)}
    assert wan_metrics(plan, deltas) == {"wan_max_depth": 3_000_000, "wan_drops": 8, "zone_pfc_tx": 42}


def test_go_back_n_waits_longer_than_a_wan_round_trip_and_a_full_dci_queue():
    """At 100 km and dilation 4000 the round trip is 3.92 s of lab time and a 64 MB queue drains in
    5.12 s at 100 Mbit/s: a timer of 1 s (250 us x 4000) fired while ACKs were still on their way."""
    from pathlib import Path
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from labctl.traffic.pool import retransmission_timeout
    topo = str(Path(__file__).resolve().parents[1] / "topologies" / "scale-across.yml")
    far = compile_plan(load_topology(topo, ["distance=100", "wan_buffer=64MB"], "t"))
    assert retransmission_timeout(far) == pytest.approx(1.0 + 3.92 + 5.12, rel=1e-3)
    near = compile_plan(load_topology(topo, ["distance=1", "wan_buffer=2MB"], "t"))
    assert retransmission_timeout(near) == pytest.approx(1.0 + 0.0392 + 0.16, rel=1e-3)


def test_the_replica_all_reduce_bursts_12_6_mb_into_the_dci_router_per_phase():
    """scale-across-buffers' model: one layer at hidden 1024 in bf16, sharded over a zone's 2 GPUs;
    the replica all-reduce sends, per phase and per direction, 2 x half a 12.6 MB shard across the
    WAN. It arrives at the two GPUs' 800G (the spine-DCI link is as fast: nothing queues in the
    zone) and leaves at 400G: half of it queues (docs/load-balancing.md)."""
    from labctl.experiment.spec import load_experiment
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from labctl.traffic import fsdp, schedule as sch
    root = Path(__file__).resolve().parents[1]
    exp, _, _ = load_experiment(root / "experiments" / "scale-across-buffers.yml")
    plan = compile_plan(load_topology(root / "topologies" / "scale-across.yml", exp.set, name="t"))
    gpus = sorted((n.rank, n.zone) for n in plan.nodes if n.rank is not None)
    zone = dict(gpus)
    per_zone = sum(1 for _, z in gpus if z == gpus[0][1])
    assert per_zone == 2
    model = fsdp.model_from(None, 1, 1024, None, "bf16")
    crossing = 0
    for stage in fsdp.fsdp_step(model, list(zone), "HYBRID_SHARD", per_zone):
        for c in stage:
            if "replica" not in c.label:
                continue
            for group in c.groups:
                s = sch.GENERATORS[c.collective](list(group), c.size, 512 * 1024, 1)
                crossing += sum(t.nbytes for t in s.transfers if zone[t.src] == "z1" and zone[t.dst] == "z2")
    per_phase = crossing / 2                      # reduce-scatter, then all-gather
    assert per_phase == pytest.approx(12.6e6, rel=0.01)
    (into_dci,) = [lk.rate_bps for lk in plan.links if set(lk.nodes) == {"z1-spine1", "z1-dci1"}]
    from_gpus = sum(lk.rate_bps for lk in plan.links if any(n.startswith("z1-srv") for n in lk.nodes))
    arrival = min(into_dci, from_gpus)          # the zone's GPUs, or the spine link if it is slower
    assert arrival == from_gpus == 800 * 10**9
    peak = per_phase * (1 - 400e9 / arrival)
    assert peak == pytest.approx(6.3e6, rel=0.01)
    assert 2 * 2_000_000 < peak < qos.bdp_bytes(400 * 10**9, 100 * 4900)    # drops at 2 MB, not at the BDP


def test_a_run_whose_wan_queue_never_filled_is_said_to_test_no_buffer():
    from labctl.experiment.wan import unfilled_queues
    metrics = {"nocc@2MB": {"wan_max_depth": 2_000_000, "wan_drops": 310},      # filled and dropped
               "nocc@bdp": {"wan_max_depth": 30_000, "wan_drops": 0},          # never filled
               "nocc@64MB": {"wan_max_depth": 6_300_000, "wan_drops": 0},
               "dcqcn@2MB": {"wan_max_depth": 2_000_000, "wan_drops": 12},
               "dcqcn@64MB": {"wan_max_depth": 900_000, "wan_drops": 0},       # DCQCN's own runs compared
               "tcp": {"time_s": 3.0}}                                         # no WAN metrics: no note
    notes = unfilled_queues(metrics, "wan_buffer")
    assert list(notes) == ["nocc@bdp"]
    assert "30.0 kB" in notes["nocc@bdp"] and "nocc@64MB's 6.30 MB" in notes["nocc@bdp"]
    # a sweep over something else (TE modes, distances): a shallow queue is its answer, no note
    assert unfilled_queues(metrics, "te") == {} and unfilled_queues(metrics, None) == {}
    # a run whose lab carried nothing over a WAN (zones=1) gets no WAN note
    metrics["nocc@bdp"]["wan_port_bytes"] = 0
    assert unfilled_queues(metrics, "wan_buffer") == {}


def test_frontend_drops_count_only_the_frontend_fabrics_ports():
    from labctl.experiment.metrics import frontend_ports
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    plan = compile_plan(load_topology(Path(__file__).resolve().parents[1] / "topologies/ai-cluster.yml", []))
    ports = frontend_ports(plan)
    assert ("fe-leaf1", "stor1") in ports and ("stor1", "fe-leaf1") in ports and ("srv1-gpu0", "fe-leaf1") in ports
    assert not any(node in ("leaf1", "spine1") for node, _ in ports)          # the backend's switches
    gpu_ports = {p for n, p in ports if n == "srv1-gpu0"}
    assert gpu_ports == {"fe-leaf1"}                                          # its backend NIC is not
