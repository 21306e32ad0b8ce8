"""NODE and NODE:PORT as users write them, resolved against a lab's plan in one place."""
from __future__ import annotations

import ipaddress

from labctl.errors import LabError
from labctl.names import split_endpoint
from labctl.plan.model import Interface, LabPlan, Node


def node(plan: LabPlan, name: str) -> Node:
    try:
        return plan.node(name)
    except KeyError:
        pass
    # a containerlab file's PC1 is pc1 here (names are lower case): the name as the file wrote it
    # still names it, when no other node differs from it only in case
    same = [n for n in plan.nodes if n.name.casefold() == name.casefold()]
    if len(same) == 1:
        return same[0]
    wires = [f"wire{lk.id}.a" for lk in plan.links if lk.wire]
    raise LabError(f"lab {plan.lab!r} has no node {name!r}",
                   f"`labctl status {plan.lab}` lists the nodes"
                   + (f"; WAN line ends: {', '.join(wires)} (.a/.b)" if wires else ""))


def port(plan: LabPlan, spec: str, need_port: bool = True) -> tuple[Node, Interface | None]:
    """NODE:PORT (or NODE alone when `need_port` is false) as the node and its port."""
    name, port_name = split_endpoint(spec)
    n = node(plan, name)
    if not port_name:
        if need_port:
            raise LabError(f"{spec!r} names no port",
                           f"write NODE:PORT, e.g. {name}:{n.interfaces[0].name}" if n.interfaces else "")
        return n, None
    for i in n.interfaces:
        if i.name == port_name:
            return n, i
    raise LabError(f"{name} has no port {port_name!r}", f"its ports: {', '.join(i.name for i in n.interfaces)}")


def capture_point(plan: LabPlan, spec: str) -> tuple[str, str]:
    """NODE:PORT -> (namespace, port); NODE may also be a WAN line end, wire<link>.a / .b (port fibre)."""
    name, port_name = split_endpoint(spec)
    port_name = port_name or ""
    for lk in plan.links:
        if lk.wire and name in (f"wire{lk.id}.a", f"wire{lk.id}.b"):
            side = "a" if name.endswith(".a") else "b"
            if port_name not in ("fibre", side, ""):
                raise LabError(f"{name} has ports fibre and {side}")
            return (lk.wire.near if side == "a" else lk.wire.far), port_name or "fibre"
    n, i = port(plan, spec)
    return n.namespace, i.name


def address(plan: LabPlan, target: str) -> str:
    """An IP address, or a node name (its loopback, or for a host its first address), or NODE:PORT."""
    try:
        return str(ipaddress.ip_address(target))
    except ValueError:
        pass
    try:
        n, i = port(plan, target, need_port=False)
    except LabError:
        raise LabError(f"{target!r} is neither an address nor a node of lab {plan.lab!r}",
                       "name a node (labctl status shows them) or give an IPv4 address") from None
    if i is not None:
        return i.address.split("/")[0]
    if n.loopback:
        return n.loopback.split("/")[0]
    first = next((j for j in n.interfaces if j.address), None)
    if first is None:
        raise LabError(f"{n.name} is a bridge and has no address of its own", "name a host or a router")
    return first.address.split("/")[0]


def with_addresses(plan: LabPlan, node: str, words: list[str]) -> list[str]:
    """A command for NODE with other nodes' names replaced by their addresses, as Mininet's CLI does.

    A word that names one of NODE's own ports stays as it is: in a leaf-spine the ports are named
    after their peers, and `ip link show spine1` on leaf1 means the port.
    """
    names = {n.name for n in plan.nodes if n.loopback or any(i.address for i in n.interfaces)}
    own_ports = {i.name for i in plan.node(node).interfaces}
    return [address(plan, w) if w in names and w not in own_ports else w for w in words]

