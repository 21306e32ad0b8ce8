"""Golden corpus (netlab's input → expected, beside tests/test_golden.py): every bundled template
with each variable at its edges (its minimum, its maximum up to 64, the other truth value, each
other choice), every bundled and test lab file, and every containerlab file the importer accepts;
each with its rendered YAML and its plan, or, for an edge the template refuses, its located error.

Regenerate after an intended change with `UPDATE_GOLDEN=1 pytest tests/test_golden_corpus.py`
and review the diff like code. Inputs are written to pytest's temporary directory only.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from labctl.errors import InputError
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology, render_topology

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).parent / "golden" / "corpus"
MAX_EDGE = 64          # a larger maximum (256 servers) makes a plan of tens of megabytes
# a plan larger than this is kept as a summary (counts by kind, and digests of the plan and the
# rendered YAML): 64 spines make 5 MB of plan, which no one reviews as a diff, but any change
# still fails the test
FULL_UP_TO = 200_000


def template_edges() -> list[tuple[str, dict]]:
    """(case id, lab document) for each template variable's edge values, the others at their defaults."""
    out = []
    for vars_file in sorted((ROOT / "templates").glob("*/vars.yml")):
        name = vars_file.parent.name
        for var, spec in yaml.safe_load(vars_file.read_text())["vars"].items():
            values = []
            if spec["type"] in ("int", "float"):
                values += [spec[k] for k in ("min", "max") if k in spec and spec[k] <= MAX_EDGE]
            if spec["type"] == "bool":
                values.append(not spec["default"])
            values += spec.get("choices", [])
            for v in dict.fromkeys(v for v in values if v != spec.get("default")):
                out.append((f"tpl-{name}-{var}-{v}", {"name": "edge", "template": name, "vars": {var: v}}))
    return out


FILES = ([(f"topo-{p.stem}", p) for p in sorted((ROOT / "topologies").glob("*.yml"))]
         + [(f"test-{p.stem}", p) for p in sorted((ROOT / "tests" / "topologies").glob("*.yml"))]
         + [(f"clab-{p.name.removesuffix('.clab.yml')}", p) for p in sorted((ROOT / "tests" / "clab").glob("*.clab.yml"))])
EDGES = template_edges()
IDS = [i for i, _ in EDGES] + [i for i, _ in FILES]


def _check(expected: Path, actual: str):
    if os.environ.get("UPDATE_GOLDEN"):
        expected.parent.mkdir(exist_ok=True)
        expected.write_text(actual)
    assert expected.exists(), f"no golden file {expected}; run with UPDATE_GOLDEN=1"
    assert actual == expected.read_text(), f"{expected.name} differs; review and UPDATE_GOLDEN=1 if intended"


def _input(case_id: str, tmp_path: Path) -> Path:
    doc = dict(EDGES).get(case_id)
    if doc is None:
        return dict(FILES)[case_id]
    f = tmp_path / "edge.yml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def test_the_corpus_has_at_least_60_inputs_and_no_stale_files():
    assert len(IDS) == len(set(IDS)) and len(IDS) >= 60, len(IDS)
    suffixes = (".error.txt", ".summary.json", ".rendered.yml", ".plan.json")
    stale = {next(p.name.removesuffix(x) for x in suffixes if p.name.endswith(x)) for p in CORPUS.glob("*")} - set(IDS)
    assert not stale, f"golden files with no input: {sorted(stale)}"


@pytest.mark.parametrize("case_id", IDS)
def test_render_and_plan_match_golden(case_id, tmp_path):
    f = _input(case_id, tmp_path)
    try:
        text, _, _ = render_topology(f)
        plan = compile_plan(load_topology(f))
    except InputError as exc:                     # an edge the template refuses: its error is the golden
        _check(CORPUS / f"{case_id}.error.txt", str(exc).replace(str(f), case_id).replace(str(ROOT), "<repo>") + "\n")
        return
    plan_text = json.dumps(plan.to_dict(), indent=1, sort_keys=True) + "\n"
    # a containerlab file's plan names its own path (binds, description): the clone's place is not golden
    text, plan_text = (t.replace(str(ROOT), "<repo>") for t in (text, plan_text))
    if len(plan_text) > FULL_UP_TO:
        kinds = sorted({n.kind for n in plan.nodes})
        summary = {"nodes": {k: sum(n.kind == k for n in plan.nodes) for k in kinds}, "links": len(plan.links),
                   "routes": sum(len(n.routes) for n in plan.nodes),
                   "plan_sha256": hashlib.sha256(plan_text.encode()).hexdigest(),
                   "rendered_sha256": hashlib.sha256(text.encode()).hexdigest()}
        _check(CORPUS / f"{case_id}.summary.json", json.dumps(summary, indent=1) + "\n")
        return
    _check(CORPUS / f"{case_id}.rendered.yml", text)
    _check(CORPUS / f"{case_id}.plan.json", plan_text)


def test_an_edge_plan_is_deterministic(tmp_path):
    f = _input(EDGES[0][0], tmp_path)
    assert compile_plan(load_topology(f)).to_dict() == compile_plan(load_topology(f)).to_dict()
