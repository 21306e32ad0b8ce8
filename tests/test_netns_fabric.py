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
