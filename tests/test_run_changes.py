"""What changed in a lab while a run played (traffic/changes.py), from its record: no root."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import changes

ROOT = Path(__file__).resolve().parents[1]


def test_an_lb_mode_and_a_port_rate_changed_during_a_run_are_named(tmp_path):
    """`labctl lb leaf=spray` 3 s into a run left its plan.json saying ecmp and its report silent."""
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", ["lb=ecmp"]))
    lab_dir = tmp_path / plan.lab
    lab_dir.mkdir()
    (lab_dir / "plan.json").write_text(json.dumps(plan.to_dict()))

    class Lab:
        path = lab_dir
    began = changes.record(Lab)
    assert changes.during(began, Lab) == []
    later = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", ["lb=ecmp"]))
    leaf = later.node("leaf2")
    leaf.flow_hash = dataclasses.replace(leaf.flow_hash, mode="spray")
    port = leaf.iface("spine1")
    port.shaping = dataclasses.replace(port.shaping, rate_bps=30_000_000)
    (lab_dir / "plan.json").write_text(json.dumps(later.to_dict()))
    said = changes.during(began, Lab)
    assert len(said) == 2 and said[0].startswith("leaf2: ") and "spray" in said[0], said
    assert said[1] == "leaf2:spine1: 100 Mbit/s -> 30 Mbit/s", said
