"""Export formats: a lab's plan written out for another tool. One registry; a new format is one
module and one entry (the Mininet and containerlab exports go here)."""
from __future__ import annotations

import json

from labctl.errors import LabError
from labctl.exports import clab, graph, mininet
from labctl.paths import is_file
from labctl.plan.model import LabPlan


def _json(plan: LabPlan) -> str:
    return json.dumps(plan.to_dict(), indent=1) + "\n"


FORMATS = {
    "dot": (graph.dot, "Graphviz: labctl export FILE | dot -Tpng > lab.png"),
    "mermaid": (graph.mermaid, "Mermaid, for a Markdown ```mermaid block"),
    "json": (_json, "the whole plan as JSON (what `labctl plan --json` prints)"),
    "mininet": (mininet.export, "a standalone Mininet script: no argument opens its CLI, --test pings every pair"),
    "clab": (clab.export, "a containerlab topology (.clab.yml): linux nodes on labctl's image, exec: lines"),
}
STRICT_FORMATS = ("clab",)


def export(plan: LabPlan, fmt: str, strict: bool = False) -> str:
    if fmt not in FORMATS:
        raise LabError(f"there is no export format {fmt!r}", f"formats: {', '.join(FORMATS)}")
    if strict and fmt not in STRICT_FORMATS:
        raise LabError(f"--strict is for --format {', '.join(STRICT_FORMATS)}", "leave --strict out")
    return FORMATS[fmt][0](plan, strict=True) if strict else FORMATS[fmt][0](plan)


def plan_of(source: str | None, sets=(), topo: str | None = None, trust: bool = False) -> LabPlan:
    """A running lab's recorded plan if `source` names one, else the plan compiled from a file (or a
    Mininet topology with `topo`)."""
    from labctl import state
    from labctl.lifecycle import load_plan
    if topo is None and state.valid_lab_name(source) and not is_file(source):
        lab = state.lab_dir(source)
        if lab.plan_file.is_file():
            return load_plan(lab)
    from labctl.plan.compile import compile_plan
    from labctl.topology import sources
    return compile_plan(sources.load(source, sets, topo=topo, trust=trust))
