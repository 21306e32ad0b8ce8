"""Everything bundled works as shipped: every topology comes up, reaches every pair and goes down
clean; every workload runs, at its smallest size, with every byte accounted."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from conftest import lab_namespaces, module_state_dir, require_root, take_down
from labctl import lifecycle as labmod
from labctl import procs
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yml"))
# dcqcn-fair has one size, whose 150 MB take half a minute: tests/test_netns_dcqcn.py runs it whole
# on the same lab and holds it to these checks and to its fairness, so it is not run twice
WORKLOADS = sorted(w for w in (ROOT / "workloads").glob("*.yml") if w.stem != "dcqcn-fair")
pytestmark = pytest.mark.netns


@pytest.mark.untimed
@pytest.mark.parametrize("topology", TOPOLOGIES, ids=[t.stem for t in TOPOLOGIES])
def test_every_bundled_topology_comes_up_reaches_every_pair_and_goes_down_clean(topology, state_dir, lab_name):
    require_root()
    plan, lab, _ = labmod.up(str(topology), name=lab_name)
    try:
        tried, failed = labmod.pingall(plan)
        hosts = [n for n in plan.nodes if not n.forwarding]
        assert tried >= len(hosts) * (len(hosts) - 1) // 4 and failed == [], (tried, failed)
        pids = [e for e in lab.journaled("pid")]
        assert all(procs.verified(e) for e in pids), pids       # every helper it needs is running
    finally:
        labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []
    assert not any(procs.verified(e) for e in pids)
    assert not lab.path.exists()


@pytest.fixture(scope="module")
def labs(tmp_path_factory):
    """The bundled leaf-spine and ai-cluster, up for this module's workloads."""
    require_root()
    names = {t: f"lt{uuid.uuid4().hex[:6]}" for t in ("leaf-spine", "ai-cluster")}
    made = {}
    with module_state_dir(tmp_path_factory):
        try:
            for t, name in names.items():
                made[t] = labmod.up(str(ROOT / "topologies" / f"{t}.yml"), name=name)[:2]
            yield made
        finally:
            take_down(names.values())


def smallest(workload: Path, tmp_path: Path) -> Path:
    """The workload with only its smallest size, one iteration, no warm-up; its TCP flows send
    2 MB each, as often as the workload says (the sizes are what takes time, not what is checked)."""
    data = yaml.safe_load(workload.read_text())
    loaded = load_workload(workload)
    if loaded.workload.collective:
        data["sizes"] = [min(loaded.workload.size_list())]
        data["iterations"], data["warmup"] = 1, 0
    for flow in data.get("flows", []):
        if "size" in flow:
            flow["size"] = "2MB"
    out = tmp_path / workload.name
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.stem for w in WORKLOADS])
def test_every_bundled_workload_runs_with_every_byte_accounted(labs, workload, tmp_path):
    uses_storage = any(f.get("to") == "storage" for f in yaml.safe_load(workload.read_text()).get("flows", []))
    plan, lab = labs["ai-cluster" if uses_storage else "leaf-spine"]
    doc = run_workload(plan, lab, load_workload(smallest(workload, tmp_path)), tmp_path / "run")
    for r in doc["results"]:
        assert r["wrong"] == 0 and not r["timed_out"], (workload.stem, r["label"], r["wrong"])
    rx = [q for c in doc["counters"].values() for q in c["rx"]]
    tx = [q for c in doc["counters"].values() for q in c["tx"]]
    assert sum(q["gaps"] for q in rx) == 0 and sum(q["packets"] for q in rx) == sum(q["packets"] for q in tx)
    assert doc["loss_ledger"]["lossless_drops"] == 0, doc["loss_ledger"]
    if doc.get("flows"):
        assert all(f["received"] == f["size"] and not f["error"] for f in doc["flows"]), doc["flows"]
    else:
        assert doc["results"], workload.stem
