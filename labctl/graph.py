"""Drawings of a lab (Graphviz dot, Mermaid), rendered from the plan through Jinja2 export templates."""
from __future__ import annotations


import jinja2

from labctl.paths import is_file
from labctl.plan.model import LabPlan
from labctl.topology.templates import bundled_dir
from labctl.units import format_rate

SHAPES = {"switch": "box", "router": "box", "nvswitch": "box3d", "gpu": "ellipse", "storage": "cylinder",
          "host": "ellipse"}


def plan_from(source: str, sets=()) -> LabPlan:
    """A running lab's recorded plan if `source` names one, else the plan compiled from a file."""
    from labctl import state
    from labctl.lab import load_plan
    if state.valid_lab_name(source) and not is_file(source):
        lab = state.lab_dir(source)
        if lab.plan_file.is_file():
            return load_plan(lab)
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    return compile_plan(load_topology(source, sets))


def render_graph(plan: LabPlan, fmt: str) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(bundled_dir() / "export")),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    ids = {n.name: f"n{n.index}" for n in plan.nodes}
    return env.get_template(f"graph.{fmt}.j2").render(
        plan=plan, shapes=SHAPES, ids=ids, fabrics=plan.fabrics, rate=lambda b: format_rate(b).replace(" ", ""))
