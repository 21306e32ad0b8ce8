"""What a backend (a node runtime) does, and the contract every one of them keeps.

The contract: whatever builds a node (namespaces, Mininet, a container engine), the node's network
namespace is reachable as the named netns `<lab>-<node>` under /var/run/netns, holding the
node's ports under their planned names. Everything above the backend (the controller, agents,
captures, the sampler, the CLI) works on that named netns alone and never asks what built it.

A backend builds and destroys; the changes made while a lab runs (links, routes, rates) are the
same kernel calls inside the named netns for every backend (netconf.py), so the base class does
them and a backend overrides only what it must.
"""
from __future__ import annotations

from typing import Callable

from labctl.kernel import netconf
from labctl.plan.model import Interface, LabPlan, Node, Route
from labctl.state import LabDir

Progress = Callable[[str, int, int], None]


def quiet(stage: str, done: int, total: int) -> None:
    pass


class Backend:
    name = "?"
    description = ""
    build_images = True     # a missing labctl/* image is built on first use; False: refused with the command

    def available(self) -> str | None:
        """None if this backend can build on this machine, else why not (with what installs it)."""
        return None

    def check(self, plan: LabPlan) -> list[tuple[str, str, str]]:
        """What in `plan` this backend cannot build, before anything is made: (plan key, reason, fix)
        for each. `labctl up` turns these into located InputErrors."""
        return []

    def apply(self, plan: LabPlan, lab: LabDir, progress: Progress = quiet) -> None:
        """Build the plan; journal everything before making it; on failure remove what was made."""
        raise NotImplementedError

    def destroy(self, lab: LabDir, keep_record: bool = False) -> list[str]:
        """Remove everything the lab's journal lists; returns the namespaces removed."""
        raise NotImplementedError

    def set_link(self, node: Node, iface: Interface, up: bool, neighbours: list = ()) -> None:
        netconf.set_link(node, iface, up, neighbours)

    def replace_routes(self, node: Node, old: list[Route], new: list[Route]) -> int:
        return netconf.replace_routes(node, old, new)

    def set_rate(self, node: Node, iface: Interface, rate_bps: int) -> None:
        netconf.set_rate(node, iface, rate_bps)

    def exec_argv(self, node: Node, argv: list[str]) -> list[str]:
        """A command line that runs `argv` inside the node (an argv list: nothing goes through a shell):
        in a container node, in the container (its own tools, e.g. vtysh); elsewhere in its netns."""
        if node.container:
            from labctl.containers import engine, nodes
            client = engine.client()
            try:
                return nodes.enter_argv(client, node.container.name, argv)
            finally:
                client.close()
        return self.netns_argv(node, argv)

    def netns_argv(self, node: Node, argv: list[str]) -> list[str]:
        """A command line that runs this machine's `argv` in the node's netns (what labctl's own
        checks use: a container image needs no ping, tcpdump or Python)."""
        return ["ip", "netns", "exec", node.namespace, *argv]

