"""The layers of labctl, enforced: a module imports only from its own layer or the layers below,
and no two packages import each other (directly or round a longer cycle). Imports inside functions
count: a lazy import is still a dependency.

The order is written down in the README ("How labctl is built"); a new module goes into the layer
that matches what it needs."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "labctl"

# lowest first; a name is a top-level module or package of labctl
LAYERS = [
    {"errors", "units", "paths", "names", "kinds", "procs", "wakeup", "capabilities", "switches"},
    {"topology"},
    {"plan"},
    {"state", "helpers"},
    {"containers"},
    {"kernel"},
    {"cluster"},
    {"backends"},
    {"telemetry"},
    {"dataplane", "wan"},
    {"traffic"},
    {"lifecycle"},
    {"experiment", "exports", "estimate"},
    {"doctor", "probe", "cli", "api", "__main__", "__init__"},
]
LAYER_OF = {name: k for k, names in enumerate(LAYERS) for name in names}


def unit(module: str) -> str:
    """labctl.plan.compile -> plan; labctl.units -> units; labctl -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> list[tuple[str, str, str]]:
    """(importing module, imported module, file:line) for every labctl import in labctl."""
    out = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(p for p in rel.parts if p != "__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}:{node.lineno}: use an absolute import (from labctl...)")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labctl"):
                # `from labctl.backends import mininet` depends on labctl.backends.mininet itself
                pkg = ROOT.parent.joinpath(*node.module.split("."))
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                           if (pkg / f"{a.name}.py").exists() or (pkg / a.name).is_dir()]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("labctl")]
            for t in targets:
                if t != "labctl":
                    out.append((module, t, f"{path.relative_to(ROOT.parent)}:{node.lineno}"))
    return out


def test_every_module_belongs_to_a_layer():
    units = {unit(m) for m, _, _ in imports()} | {p.stem if p.is_file() else p.name
                                                    for p in ROOT.iterdir() if p.suffix == ".py" or p.is_dir()}
    units.discard("__pycache__")
    assert units <= set(LAYER_OF), f"put these in a layer of tests/test_layers.py: {sorted(units - set(LAYER_OF))}"


def test_no_module_imports_from_a_higher_layer():
    wrong = [f"{where}: {src} imports {dst}" for src, dst, where in imports()
             if LAYER_OF[unit(dst)] > LAYER_OF[unit(src)]]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_packages():
    g = nx.DiGraph()
    g.add_edges_from((unit(src), unit(dst)) for src, dst, _ in imports() if unit(src) != unit(dst))
    assert list(nx.simple_cycles(g)) == []


def test_no_module_outside_backends_touches_a_concrete_backend():
    concrete = {"labctl.backends.netns", "labctl.backends.mininet"}
    wrong = [f"{where}: {dst}" for src, dst, where in imports()
             if dst in concrete and not src.startswith("labctl.backends")]
    assert not wrong, "\n".join(wrong)
