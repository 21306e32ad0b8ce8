"""After a lab is cabled: run each node's exec lines, then learn the addresses they gave.

exec lines are the lab file's own commands (containerlab's `exec:`), run in file order, each as an
argv list with no shell: in a container node inside the container (its own filesystem and
tools, as `docker exec` runs them), in a namespace node with `ip netns exec` (this machine's tools).
A line that fails fails `up`, which then removes what it made.

A node with `addresses: none` is numbered by those lines, so the plan cannot know its addresses:
they are read back from the kernel once the lines ran and written into the lab's plan, after
which pingall, route, exec's node names and the agents use them as any planned address.
"""
from __future__ import annotations

import shlex
import socket
import subprocess

from labctl.kernel import nsutil
from labctl.errors import LabError
from labctl.plan.model import LabPlan
from labctl.state import LabDir

EXEC_TIMEOUT_S = 120
OUTPUT_KEPT = 4096      # bytes of a line's output kept, its last: what a failure shows is its last 300
EXEC_PARALLEL = 8


def run_exec_lines(plan: LabPlan, lab: LabDir, progress=None) -> None:
    """Each node's lines in order, nodes side by side (as containerlab does)."""
    nodes = [n for n in plan.nodes if n.exec]
    if not nodes:
        return
    from concurrent.futures import ThreadPoolExecutor
    from labctl.cluster.engines import Engines
    engines = Engines()
    total, done = sum(len(n.exec) for n in nodes), [0]

    def node_lines(node) -> str | None:
        ctr = engines.container(node) if node.container else None
        if node.container and not (ctr and ctr.attrs["State"].get("Running")):
            return f"node {node.name}: its container is not running"
        for argv in node.exec:
            code, out = _in_container(engines.client(node.machine), ctr, argv) if ctr else _in_namespace(node, argv)
            if code != 0:
                return (f"node {node.name}: exec line `{shlex.join(argv)}` exited with status {code}: "
                        f"{out.strip()[-300:] or 'no output'}")
            done[0] += 1
            if progress:
                progress("exec", done[0], total)
        return None

    try:
        with ThreadPoolExecutor(max_workers=EXEC_PARALLEL) as pool:
            errors = [e for e in pool.map(node_lines, nodes) if e]
    finally:
        engines.close()
    if errors:
        raise LabError(errors[0], "fix the line under the node's exec: (`labctl plan FILE` lists them)")


def _in_container(client, ctr, argv: list[str]) -> tuple[int, str]:
    """The line as `docker exec` runs it, through the engine's API: the engine gives it the
    container's namespaces, root, environment, cgroup, capabilities, seccomp and no_new_privs, and
    nothing of the container's (its env: above all) reaches a process of this host's. Through the
    API rather than the docker client, which costs a process of its own per line (about 50 ms).
    Its output is streamed on a thread of its own and only its tail kept, and the line is given up
    on at EXEC_TIMEOUT_S whether it writes (`exec: [yes]` filled root's memory) or is silent (the
    stream's reads have no timeout of their own)."""
    import threading
    import time
    import requests
    deadline = time.monotonic() + EXEC_TIMEOUT_S
    try:
        made = client.api.exec_create(ctr.id, argv, stdout=True, stderr=True, stdin=False)
        stream = client.api.exec_start(made["Id"], stream=True)
    except requests.exceptions.ReadTimeout:
        return 124, f"still running after {EXEC_TIMEOUT_S} s"
    tail, ended, failed = bytearray(), threading.Event(), []

    def read() -> None:
        nonlocal tail
        try:
            for chunk in stream:
                tail = (tail + chunk)[-OUTPUT_KEPT:]
                if time.monotonic() > deadline:
                    return
        except Exception as exc:      # the connection's errors: raised below, as before
            failed.append(exc)
        finally:
            ended.set()

    threading.Thread(target=read, name="exec-output", daemon=True).start()
    if not ended.wait(max(0.0, deadline - time.monotonic())) or time.monotonic() > deadline:
        return 124, f"still running after {EXEC_TIMEOUT_S} s"
    if failed:
        raise failed[0]
    code = client.api.exec_inspect(made["Id"])["ExitCode"]
    return (code if code is not None else 1), tail.decode(errors="replace")


def _in_namespace(node, argv: list[str]) -> tuple[int, str]:
    """The line in the node's namespace, its output's tail kept (stderr and stdout as they came),
    killed after EXEC_TIMEOUT_S."""
    import os
    import select
    import time
    deadline = time.monotonic() + EXEC_TIMEOUT_S
    p = subprocess.Popen(["ip", "netns", "exec", node.namespace, *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/")
    tail = bytearray()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return 124, f"still running after {EXEC_TIMEOUT_S} s"
            if select.select([p.stdout], [], [], left)[0]:
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    break
                tail = (tail + chunk)[-OUTPUT_KEPT:]
        return p.wait(timeout=max(0.1, deadline - time.monotonic())), tail.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return 124, f"still running after {EXEC_TIMEOUT_S} s"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()


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
    lab.write_plan(plan.to_dict())
    return True
