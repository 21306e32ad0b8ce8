"""Golden tests of the pure pipeline (netlab's input → expected): topology file → rendered YAML →
plan JSON, for every bundled template and for WAN wires, a shared buffer and an L2 segment; and
every export format of two of them.

Regenerate after an intended change with `UPDATE_GOLDEN=1 pytest tests/test_golden.py` and review
the diff like code.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from labctl import exports
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


EXPORTED = [GOLDEN / "leaf-spine-2x2.yml", GOLDEN / "bridged.yml"]


@pytest.mark.parametrize("fmt", [f for f in exports.FORMATS if f != "json"])
@pytest.mark.parametrize("case", EXPORTED, ids=[c.stem for c in EXPORTED])
def test_export_matches_golden(case, fmt):
    plan = compile_plan(load_topology(case))
    _check(case.with_suffix(f".{fmt}"), exports.export(plan, fmt))


def test_json_export_is_the_plan():
    import json as _json
    plan = compile_plan(load_topology(EXPORTED[0]))
    assert _json.loads(exports.export(plan, "json")) == plan.to_dict()


def test_every_bundled_template_has_a_golden_case():
    from labctl.topology import templates as tpl
    bundled = {t.name for t in tpl.list_templates([tpl.bundled_dir()])}
    used = {load_topology(c).template for c in CASES} - {None}
    assert bundled <= used, f"add a golden case for {sorted(bundled - used)}"


def test_plan_is_deterministic():
    a = compile_plan(load_topology(CASES[0])).to_dict()
    b = compile_plan(load_topology(CASES[0])).to_dict()
    assert a == b
