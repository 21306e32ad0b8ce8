"""After a lab is cabled: run each node's exec lines, then learn the addresses they gave.

exec lines are the lab file's own commands (containerlab's `exec:`), run in file order, each as an
argv list with no shell: in a container node through the engine (in the container's own
filesystem, as `docker exec`), in a namespace node with `ip netns exec` (this machine's tools).
A line that fails fails `up`, which then removes what it made.

A node with `addresses: none` is numbered by those lines, so the plan cannot know its addresses:
they are read back from the kernel once the lines ran and written into the lab's plan, after
which pingall, route, exec's node names and the agents use them as any planned address.
"""
from __future__ import annotations

import json
import socket
import subprocess

from labctl.backends import nsutil
from labctl.errors import LabError
from labctl.plan.model import LabPlan
from labctl.state import LabDir

EXEC_TIMEOUT_S = 120


def run_exec_lines(plan: LabPlan, lab: LabDir, progress=None) -> None:
    lines = [(node, argv) for node in plan.nodes for argv in node.exec]
    if not lines:
        return
    client = None
    try:
        for k, (node, argv) in enumerate(lines):
            if node.container:
                if client is None:
                    from labctl.containers import engine
                    client = engine.client()
                code, out = _in_container(client, node.container.name, argv)
            else:
                r = subprocess.run(["ip", "netns", "exec", node.namespace, *argv], capture_output=True,
                                   text=True, timeout=EXEC_TIMEOUT_S, stdin=subprocess.DEVNULL, cwd="/")
                code, out = r.returncode, (r.stderr or r.stdout)
            if code != 0:
                shown = " ".join(argv)
                raise LabError(f"node {node.name}: exec line `{shown}` exited with status {code}: "
                               f"{out.strip()[-300:] or 'no output'}",
                               "fix the line under the node's exec: (`labctl plan FILE` lists them)")
            if progress:
                progress("exec", k + 1, len(lines))
    except FileNotFoundError as exc:
        raise LabError(f"cannot run an exec line: {exc}") from None
    finally:
        if client is not None:
            client.close()


def _in_container(client, name: str, argv: list[str]) -> tuple[int, str]:
    ctr = client.containers.get(name)
    try:
        result = ctr.exec_run(argv, stdin=False, tty=False)
    except Exception as exc:            # the engine's "executable file not found" is an APIError
        return 127, str(getattr(exc, "explanation", None) or exc)
    return result.exit_code, result.output.decode(errors="replace")


def learn_addresses(plan: LabPlan, lab: LabDir) -> bool:
    """Fill in the addresses of unnumbered nodes' ports from the kernel; rewrite plan.json if any."""
    unnumbered = [n for n in plan.nodes if not n.numbered]
    if not unnumbered:
        return False
    from pyroute2 import IPRoute
    by_port: dict[tuple[str, str], str] = {}
    for node in unnumbered:
        with nsutil.entered(node.namespace):
            ipr = IPRoute()
        try:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            for a in ipr.get_addr(family=socket.AF_INET):
                port = names.get(a["index"])
                if port and port != "lo" and (node.name, port) not in by_port:
                    by_port[(node.name, port)] = f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}"
        finally:
            ipr.close()
    for node in unnumbered:
        for iface in node.interfaces:
            iface.address = by_port.get((node.name, iface.name), "")
    for node in plan.nodes:
        for iface in node.interfaces:
            peer = by_port.get((iface.peer_node, iface.peer_iface))
            if peer and not plan.node(iface.peer_node).bridged:
                iface.peer_address = peer.split("/")[0]
    lab.plan_file.write_text(json.dumps(plan.to_dict()))
    return True
