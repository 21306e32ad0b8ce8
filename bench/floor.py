"""The floor for bring-up: a lab plan's namespaces, veths and addresses made with iproute2 alone.

Two ways, both timed by bench/bringup.py next to labctl:

- `ip -batch`: as few processes as iproute2 allows. One batch makes every namespace and veth (each
  end created in its namespace, one queue, as labctl does); `ip` cannot switch namespaces inside a
  batch, so each namespace then gets one `ip -n NS -batch -` for its addresses and link-ups.
- one `ip` process per command, as a shell script would do it.

Neither shapes, routes or classifies: they are what any tool must pay for the nodes and cables.
Names come from the plan (labctl's own names), and every namespace made is deleted again.
"""
from __future__ import annotations

import subprocess
import time

IP = "/usr/sbin/ip"


def _veth_args(plan) -> list[list[str]]:
    out = []
    for link in plan.links:
        a_node, a_if = link.a.split(":")
        b_node, b_if = link.b.split(":")
        out.append(["link", "add", a_if, "netns", plan.node(a_node).namespace, "numtxqueues", "1",
                    "numrxqueues", "1", "type", "veth", "peer", "name", b_if,
                    "netns", plan.node(b_node).namespace, "numtxqueues", "1", "numrxqueues", "1"])
    return out


def _per_namespace(plan) -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = {}
    for node in plan.nodes:
        cmds = out.setdefault(node.namespace, [])
        for i in node.interfaces:
            if i.address:
                cmds.append(["addr", "add", i.address, "dev", i.name])
            cmds.append(["link", "set", i.name, "up"])
    return out


def supported(plan) -> bool:
    """Plans of plain cables only (no WAN line namespaces): what the floor knows how to build."""
    return all(link.wire is None for link in plan.links)


def build_batch(plan) -> None:
    lines = [f"netns add {n.namespace}" for n in plan.nodes] + [" ".join(a) for a in _veth_args(plan)]
    subprocess.run([IP, "-batch", "-"], input="\n".join(lines) + "\n", text=True, check=True)
    for ns, cmds in _per_namespace(plan).items():
        subprocess.run([IP, "-n", ns, "-batch", "-"], input="".join(" ".join(c) + "\n" for c in cmds),
                       text=True, check=True)


def build_per_command(plan) -> None:
    for n in plan.nodes:
        subprocess.run([IP, "netns", "add", n.namespace], check=True)
    for args in _veth_args(plan):
        subprocess.run([IP, *args], check=True)
    for ns, cmds in _per_namespace(plan).items():
        for c in cmds:
            subprocess.run([IP, "-n", ns, *c], check=True)


def destroy(plan) -> None:
    lines = "".join(f"netns del {n.namespace}\n" for n in plan.nodes)
    subprocess.run([IP, "-force", "-batch", "-"], input=lines, text=True, stderr=subprocess.DEVNULL)


def timed(plan, how: str) -> dict:
    """Build and destroy the plan's floor one way ("batch" or "per-command"); seconds up and down."""
    build = build_batch if how == "batch" else build_per_command
    t0 = time.perf_counter()
    try:
        build(plan)
        t1 = time.perf_counter()
    finally:
        t2 = time.perf_counter()
        destroy(plan)
    return {"up_s": t1 - t0, "down_s": time.perf_counter() - t2}
