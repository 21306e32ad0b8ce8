"""A train: step on the bundled two-zone ai-cluster: every dimension > 1, every byte arrives, and
the WAN's port counters see the bytes the schedule puts across it, wherever the placement puts them."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from conftest import module_state_dir, require_root, take_down
from labctl import lifecycle as labmod
from labctl.kinds import fabric_kind
from labctl.lifecycle.inspect import live_links
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def two_zones(tmp_path_factory):
    require_root()
    name = f"lt{uuid.uuid4().hex[:6]}"
    with module_state_dir(tmp_path_factory):
        try:
            yield labmod.up(str(ROOT / "topologies" / "ai-cluster.yml"), ["zones=2"], name)[:2]
        finally:
            take_down([name])


def wan_port_bytes(plan) -> int:
    """Bytes sent into the WAN by both ends of every scale-across link, from the ports' counters."""
    total = 0
    for link in plan.links:
        if fabric_kind(plan.fabrics[link.fabric].kind).name == "scale-across":
            for end in (link.a, link.b):
                node, iface = end.split(":")
                total += live_links(plan.node(node).namespace)[iface]["tx_bytes"]
    return total


def run(two_zones, tmp_path, workload: str, **edits) -> tuple[dict, int]:
    plan, lab = two_zones
    data = yaml.safe_load((ROOT / "workloads" / workload).read_text())
    data["train"].update(edits)
    wf = tmp_path / f"{len(list(tmp_path.iterdir()))}.yml"
    wf.write_text(yaml.safe_dump(data))
    before = wan_port_bytes(plan)
    doc = run_workload(plan, lab, load_workload(wf), tmp_path / wf.stem)
    crossed = wan_port_bytes(plan) - before
    r = doc["results"][0]
    assert r["wrong"] == 0 and not r["timed_out"], r["label"]
    assert doc["loss_ledger"]["total"] == 0 and doc["loss_ledger"]["lossless_drops"] == 0, doc["loss_ledger"]
    # every fabric's links, counted on the ports, carried the schedule's wire bytes within 2%
    # (a fabric the step should not touch: under 1% of the run's bytes)
    assert all(f["agrees"] for f in doc["fabric_bytes_check"].values()), doc["fabric_bytes_check"]
    return doc, crossed


def test_placement_moves_the_wan_bytes_as_the_formulas_say(two_zones, tmp_path):
    """tp=2 x pp=2 x dp=4 with HSDP (shards of 2): [tp, pp, dp] puts only the replica all-reduce on
    the WAN, 16 ranks x half a stage shard; [tp, dp, pp] puts the pipeline boundary there, 2 ways x
    4 micro-batches x 4 replicas x b*s*h. The WAN ports count each within 2% of the schedule's
    wire bytes, and the ratio of the two within 5% of the formulas' (3.02)."""
    m = 202_375_168                                   # llama-7b params per layer
    dp_formula = 16 * (m * 2 / 2 * 2 * 1e-3) / 2      # ranks x (2 layers x m / tp x bf16 x scale) / shard
    pp_formula = 2 * 4 * 4 * (4096 * 4096 * 2 * 1e-3)
    got = {}
    for placement in (["tp", "pp", "dp"], ["tp", "dp", "pp"]):
        doc, crossed = run(two_zones, tmp_path, "train-llama7b.yml", placement=placement,
                           degrees={"tp": 2, "pp": 2, "dp": 4}, dp_shard=2)
        t = doc["train"]
        assert set(doc["dim_bytes"]) == {"tp", "pp", "dp", "ep"} and all(doc["dim_bytes"][d] > 0 for d in "tp pp dp".split())
        assert crossed == pytest.approx(t["fabric_wire_bytes_expected"]["scaleacross"], rel=0.02)
        assert t["fabric_bytes_expected"]["scaleup"] == 0 and t["fabric_bytes_expected"]["frontend"] == 0
        assert 0 < t["duty_cycle"] < 1 and t["compute_path_s"] > 0
        got[tuple(placement)] = (crossed, t["fabric_bytes_expected"]["scaleacross"])
    assert got[("tp", "pp", "dp")][1] == pytest.approx(dp_formula, rel=1e-3)
    assert got[("tp", "dp", "pp")][1] == pytest.approx(pp_formula, rel=1e-3)
    ratio = got[("tp", "pp", "dp")][0] / got[("tp", "dp", "pp")][0]
    assert ratio == pytest.approx(dp_formula / pp_formula, rel=0.05), ratio


def test_a_mixture_of_experts_step_with_expert_parallel(two_zones, tmp_path):
    """Mixtral-shaped, tp=2, ep=2 inside dp=8: the all-to-alls stay in a zone, dp crosses the WAN."""
    doc, crossed = run(two_zones, tmp_path, "train-mixtral.yml")
    t = doc["train"]
    assert t["degrees"] == {"tp": 2, "pp": 1, "dp": 8, "ep": 2} and t["model"]["experts"] == 8
    assert doc["dim_bytes"]["ep"] > 0 and doc["dim_bytes"]["tp"] > 0 and doc["dim_bytes"]["dp"] > 0
    assert crossed == pytest.approx(t["fabric_wire_bytes_expected"]["scaleacross"], rel=0.02)
