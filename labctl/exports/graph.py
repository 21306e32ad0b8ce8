"""Drawings of a lab (Graphviz dot, Mermaid), rendered from the plan through Jinja2 export templates."""
from __future__ import annotations

import jinja2.sandbox

from labctl.kinds import fabric_kind, node_kind
from labctl.plan.model import LabPlan
from labctl.topology.templates import bundled_dir
from labctl.units import format_rate


def render(plan: LabPlan, fmt: str) -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(str(bundled_dir() / "export")), undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    return env.get_template(f"graph.{fmt}.j2").render(
        plan=plan, ids={n.name: f"n{n.index}" for n in plan.nodes},
        kinds={n.name: node_kind(n.kind) for n in plan.nodes},
        dashed={f for f, spec in plan.fabrics.items() if fabric_kind(spec.kind).credit_based},
        rate=lambda b: format_rate(b).replace(" ", ""))


def dot(plan: LabPlan) -> str:
    return render(plan, "dot")


def mermaid(plan: LabPlan) -> str:
    return render(plan, "mermaid")
