"""Workload flows become TCP sequences between the right addresses, each from its own source port."""
from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from labctl.errors import InputError
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import flows
from labctl.traffic.workload import load_workload

AI_CLUSTER = Path(__file__).resolve().parents[1] / "topologies" / "ai-cluster.yml"


def _sequences(tmp_path: Path, sets: list[str], text: str):
    plan = compile_plan(load_topology(AI_CLUSTER, sets=sets))
    wf = tmp_path / "w.yml"
    wf.write_text(text)
    return plan, flows.sequences(plan, load_workload(wf).workload.flows, str(wf))


CHECKPOINT = ("name: c\nflows:\n  - {kind: checkpoint, from: gpus, to: storage, size: 1MB, background: true}\n"
              "  - {kind: telemetry, from: srv1-gpu0, to: sched, size: 1KB, count: 3, period: 1ms}\n")


def test_checkpoints_go_to_storage_over_whichever_network_storage_is_cabled_to(tmp_path):
    for storage_on, network in (("frontend", "10.4.0.0/16"), ("backend", "10.1.0.0/16")):
        plan, seqs = _sequences(tmp_path, [f"storage_on={storage_on}"], CHECKPOINT)
        gpus = [n.name for n in plan.nodes if n.kind == "gpu"]
        checkpoint = [s for s in seqs if s.flow == "checkpoint-0"]
        assert sorted(s.src for s in checkpoint) == sorted(gpus)
        assert all(s.count is None for s in checkpoint)          # background: until the collectives end
        for s in checkpoint:
            assert [t.name for t in s.targets] == ["stor1"]
            assert ipaddress.ip_address(s.targets[0].address) in ipaddress.ip_network(network)
        telemetry = [s for s in seqs if s.flow == "telemetry-1"]
        assert [(s.src, s.count, s.period) for s in telemetry] == [("srv1-gpu0", 3, pytest.approx(1e-3))]   # lab seconds


def test_every_sequence_sends_from_its_own_fixed_port_below_the_ephemeral_range(tmp_path):
    _, first = _sequences(tmp_path, [], CHECKPOINT)
    _, again = _sequences(tmp_path, [], CHECKPOINT)
    ports = [s.sport for s in first]
    assert len(set(ports)) == len(ports) == 9
    assert all(flows.SPORT_BASE <= p < 32768 for p in ports)
    assert ports == [s.sport for s in again]                    # the same ECMP paths in every run


def test_a_flow_to_a_node_with_no_shared_network_is_refused(tmp_path):
    text = "name: c\nflows:\n  - {kind: bulk, from: srv1-gpu0, to: spine1, size: 1MB}\n"
    with pytest.raises(InputError, match="flows.0.*spine1.*flows run between hosts"):
        _sequences(tmp_path, [], text)
