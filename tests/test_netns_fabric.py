"""Bytes per fabric measured from the ports' counters on real labs, against the schedule's figure."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from conftest import lab_namespaces, module_state_dir, require_root
from labctl import backends, state
from labctl import lifecycle as labmod
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The bundled leaf-spine: 2 servers x 4 GPUs, an NVLink domain per server."""
    require_root()
    name = f"lt{uuid.uuid4().hex[:6]}"
    with module_state_dir(tmp_path_factory):
        try:
            plan, d, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), [], name=name)
            yield plan, d
        finally:
            if state.lab_dir(name).path.exists():
                backends.get("netns").destroy(state.lab_dir(name))
            assert lab_namespaces(name + "-") == []


def run(lab, tmp_path: Path, text: str) -> dict:
    plan, d = lab
    f = tmp_path / "w.yml"
    f.write_text(text)
    return run_workload(plan, d, load_workload(f), tmp_path / "run")


def assert_agree(doc: dict) -> None:
    for fabric, c in doc["fabric_bytes_check"].items():
        assert c["agrees"], f"{fabric}: measured {c['measured']:,} B, expected {c['expected']:,} B"


def test_ring_all_reduce_bytes_per_fabric_match_the_schedule_within_2_percent(lab, tmp_path):
    doc = run(lab, tmp_path, "name: t\ncollective: all_reduce\nsizes: [4MB]\nparticipants: all\n")
    fb = doc["fabric_bytes"]
    assert fb["scaleup"] > 0 and fb["scaleout"] > 0 and fb["scaleacross"] == 0
    assert_agree(doc)


def test_a_72_rank_all_reduce_inside_an_nvl72_rack_puts_nothing_on_scale_out(tmp_path_factory, tmp_path):
    """18 servers x 4 GPUs on one NVLink switch (scaleup_gpus=72): the ring never leaves NVLink."""
    require_root()
    name = f"lt{uuid.uuid4().hex[:6]}"
    with module_state_dir(tmp_path_factory):
        try:
            plan, d, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"),
                                   ["servers=18", "scaleup_gpus=72", "dilation=32000"], name=name)
            doc = run((plan, d), tmp_path, "name: t\ncollective: all_reduce\nsizes: [2MB]\nparticipants: all\n")
        finally:
            if state.lab_dir(name).path.exists():
                backends.get("netns").destroy(state.lab_dir(name))
            assert lab_namespaces(name + "-") == []
    assert len(doc["ranks"]) == 72 and doc["results"][0]["wrong"] == 0
    assert doc["fabric_bytes"]["scaleout"] == 0, doc["fabric_bytes"]
    assert doc["fabric_bytes"]["scaleup"] > 2 * 2 * 71 / 72 * 2_000_000 * 72     # two links per ring hop
    assert_agree(doc)


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_ring_and_tree_send_their_formulas_bytes_measured_on_the_ports(lab, tmp_path, algorithm):
    """Every GPU's NIC counters (NVLink and backend ports) against the algorithm's bytes per rank."""
    from labctl.traffic import algorithms
    from labctl.traffic.pool import gpu_ranks
    from labctl.kernel import nsutil, rtnl
    plan, _ = lab
    nodes = gpu_ranks(plan)
    size, n = 4_000_000, len(nodes)

    def tx() -> dict[int, int]:
        out = {}
        for r, node in nodes.items():
            with nsutil.netlink_socket(node.namespace) as sock:
                links = rtnl.link_dump(sock)
            out[r] = sum(links[i.name]["tx_bytes"] for i in node.interfaces if i.name in links)
        return out
    before = tx()
    doc = run(lab, tmp_path, f"name: t\ncollective: all_reduce\nalgorithm: {algorithm}\nsizes: [{size}]\n"
                             "participants: all\n")
    after = tx()
    assert doc["results"][0]["algorithm"] == algorithm and doc["results"][0]["wrong"] == 0
    ranks = doc["ranks"]
    formula = (algorithms.tree_bytes_per_rank(n, size) if algorithm == "tree"
               else [2 * (n - 1) * (size // n)] * n)
    for pos, r in enumerate(ranks):
        payload = formula[pos]
        # frames: the formula's payload plus each packet's headers (4 KiB RoCE MTU, 512 KiB slices)
        frames = payload + -(-payload // 4096) * 58
        assert abs((after[r] - before[r]) - frames) <= 0.01 * frames, (r, after[r] - before[r], frames)
    assert_agree(doc)
