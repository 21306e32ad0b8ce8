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

from labctl import state
from labctl.errors import LabError
from labctl.kernel import netconf
from labctl.plan.model import Interface, LabPlan, Node, Route
from labctl.state import LabDir

Progress = Callable[[str, int, int], None]


def quiet(stage: str, done: int, total: int) -> None:
    pass


def own_namespaces(lab: LabDir) -> tuple[list[str], list[tuple[str, str]]]:
    """(the journaled namespaces of `lab` that exist and are provably the ones it made, [(name, why
    not)] for those that exist under a journaled name but are not): what `down` may remove."""
    from labctl import procs
    from labctl.kernel import nsutil
    ids, boot = lab.namespace_ids(), procs.boot_id()
    ours, others = [], []
    for name in lab.namespaces():
        now = nsutil.identity(name)
        if now is None:
            continue
        made = ids.get(name)
        if made is None:
            others.append((name, "the journal holds no identity for it: labctl stopped before it made a "
                                 "namespace of that name, or an older labctl built this lab"))
        elif made[1] != boot:
            others.append((name, "the machine restarted since this lab was built (its namespaces went with "
                                 "the restart): this one was made since, by something else"))
        elif made[0] != now:
            others.append((name, "it is not the namespace this lab made (that one was deleted, and something "
                                 "else made one of the same name)"))
        else:
            ours.append(name)
    return ours, others


def refuse_taken_namespaces(plan: LabPlan) -> None:
    """Before anything is made: every namespace the plan names is free. A lab's namespaces are
    <lab>-<node>, so lab `dc` with node `east-leaf1` and lab `dc-east` with node `leaf1` would share
    `dc-east-leaf1`: the error names the lab that holds it (and its `down`), never this one."""
    from labctl.kernel import nsutil, wires
    mine = [(n.namespace, f"node {n.name}") for n in plan.nodes]
    mine += [(ns, "a WAN line") for ns in wires.namespaces(plan)]
    for ns, what in mine:
        if not nsutil.exists(ns):
            continue
        owner = state.namespace_owner(ns, but=plan.lab)
        if owner is not None:
            raise LabError(f"lab {plan.lab!r} cannot have namespace {ns!r} (its {what}): lab {owner!r} has it "
                           f"(a lab's namespaces are <lab>-<node>, and {owner!r} + "
                           f"{ns[len(owner) + 1:]!r} gives the same name)",
                           f"`labctl down {owner}` first, or give this lab a name that is not a prefix of "
                           f"another's, or the other way round (--name)")
        raise LabError(f"lab {plan.lab!r} cannot have namespace {ns!r} (its {what}): it exists already, and no "
                       "lab labctl knows of made it", f"`ip netns del {ns}` if it is a leftover of yours; "
                       "else give this lab another name with --name")


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

    def replace_routes(self, node: Node, old: list[Route], new: list[Route], table: int = 254) -> int:
        return netconf.replace_routes(node, old, new, table)

    def set_rate(self, node: Node, iface: Interface, rate_bps: int) -> None:
        netconf.set_rate(node, iface, rate_bps)

    def exec_argv(self, node: Node, argv: list[str], interactive: bool = False) -> list[str]:
        """A command line that runs `argv` inside the node (an argv list: nothing goes through a shell):
        in a container node, in the container (its own tools, e.g. vtysh; `interactive`: with this
        process's stdin, and a terminal if it has one); elsewhere in its netns."""
        if node.container:
            from labctl.cluster.engines import Engines
            engines = Engines()
            try:
                return engines.argv(node, argv, interactive)
            finally:
                engines.close()
        return self.netns_argv(node, argv)

    def netns_argv(self, node: Node, argv: list[str]) -> list[str]:
        """A command line that runs this machine's `argv` in the node's netns (what labctl's own
        checks use: a container image needs no ping, tcpdump or Python)."""
        return ["ip", "netns", "exec", node.namespace, *argv]

