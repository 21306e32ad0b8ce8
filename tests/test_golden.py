"""Golden tests of the pure pipeline: topology file → rendered YAML → plan JSON.

Regenerate after an intended change with `UPDATE_GOLDEN=1 pytest tests/test_golden.py` and review
the diff like code.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology, render_topology

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p for p in GOLDEN.glob("*.yml") if not p.name.endswith(".rendered.yml"))


def _check(expected: Path, actual: str):
    if os.environ.get("UPDATE_GOLDEN"):
        expected.write_text(actual)
    assert expected.exists(), f"no golden file {expected}; run with UPDATE_GOLDEN=1"
    assert actual == expected.read_text(), f"{expected.name} differs; review and UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_plan_matches_golden(case):
    plan = compile_plan(load_topology(case))
    _check(case.with_suffix(".plan.json"), json.dumps(plan.to_dict(), indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_render_matches_golden(case):
    text, _, _ = render_topology(case)
    _check(case.with_suffix(".rendered.yml"), text)


def test_plan_is_deterministic():
    a = compile_plan(load_topology(CASES[0])).to_dict()
    b = compile_plan(load_topology(CASES[0])).to_dict()
    assert a == b
