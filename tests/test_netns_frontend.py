"""The frontend is a separate network: checkpoints on it leave the backend alone; cabled wrong, they don't."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import require_root
from labctl import lifecycle as labmod
from labctl import state
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

AI_CLUSTER = Path(__file__).resolve().parents[1] / "topologies" / "ai-cluster.yml"
pytestmark = pytest.mark.netns


def allreduce_seconds(plan, tmp_path: Path, tag: str, checkpoint: bool) -> tuple[float, dict]:
    """Two 4 MB ring all-reduces; with checkpoint, every GPU writes to storage over TCP meanwhile."""
    wf = tmp_path / f"{tag}.yml"
    text = "name: iso\ncollective: all_reduce\nsizes: [4MB]\niterations: 2\n"
    if checkpoint:
        text += "flows:\n  - {kind: checkpoint, from: gpus, to: storage, size: 20MB, background: true}\n"
    wf.write_text(text)
    doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / tag)
    # the RoCE class stays lossless even with storage TCP on the backend (TCP rides the lossy class)
    assert all(r["wrong"] == 0 and not r["timed_out"] for r in doc["results"]), (tag, doc["results"])
    moved = sum(f["received"] for f in doc["flows"])
    return sum(r["time_s"] for r in doc["results"]), {"tcp_bytes": moved}


def test_checkpoints_on_the_frontend_leave_the_backend_alone_but_not_on_the_backend(built_lab, lab_name, tmp_path):
    """GPU NICs at 100G (25 Mbit/s in the lab) keep the all-reduce bound by its links, not by the
    agents' CPU, so its time measures the network alone; storage at 1600G takes all the TCP the
    network gives it. Measured: 7.84 s alone, 7.87 s with every frontend NIC full (200 Mbit/s of
    TCP); storage cabled to the backend: 7.86 s -> 9.76 s (+24%), as the TCP class takes its 20%
    weight (and spare turns) on the GPU NICs and leaf-spine links."""
    require_root()
    sets = ["storage_rate=1600G", "gpu_rate=100G"]
    plan = built_lab(AI_CLUSTER, sets)
    stor = plan.node("stor1")
    assert {plan.fabrics[i.fabric].kind for i in stor.interfaces} == {"frontend"}
    alone, _ = allreduce_seconds(plan, tmp_path, "alone", False)
    loaded, tcp = allreduce_seconds(plan, tmp_path, "frontend", True)
    nics = sum(i.shaping.rate_bps for n in plan.nodes if n.kind == "gpu" for i in n.interfaces
               if plan.fabrics[i.fabric].kind == "frontend")
    assert tcp["tcp_bytes"] * 8 > 0.8 * nics * loaded, tcp        # the frontend NICs were full
    assert loaded == pytest.approx(alone, rel=0.05), (alone, loaded)
    labmod.down(lab_name)
    plan = built_lab(AI_CLUSTER, sets + ["storage_on=backend"])
    assert {plan.fabrics[i.fabric].kind for i in plan.node("stor1").interfaces} == {"scale-out"}
    alone_b, _ = allreduce_seconds(plan, tmp_path, "backend-alone", False)
    loaded_b, tcp_b = allreduce_seconds(plan, tmp_path, "backend-loaded", True)
    print(f"all-reduce: {alone:.2f} s alone, {loaded:.2f} s with frontend checkpoints; "
          f"storage on the backend: {alone_b:.2f} s alone, {loaded_b:.2f} s with checkpoints")
    gpu_nics = sum(i.shaping.rate_bps for n in plan.nodes if n.kind == "gpu" for i in n.interfaces)
    assert tcp_b["tcp_bytes"] * 8 > 0.15 * gpu_nics * loaded_b, tcp_b   # at least most of its weight share
    assert loaded_b > 1.10 * alone_b, (alone_b, loaded_b)
