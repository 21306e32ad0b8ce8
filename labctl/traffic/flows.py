"""From a workload's flows: to TCP transfer sequences between real addresses (tcpflow.py runs them)."""
from __future__ import annotations

from labctl.errors import InputError, Where
from labctl.kinds import NODE_KINDS, node_kind
from labctl.plan.routing import routing_domains
from labctl.plan.model import LabPlan, Node
from labctl.traffic.tcpflow import Sequence, Target


GROUPS = {k.group for k in NODE_KINDS.values() if k.group}   # "gpus", "storage"


def _nodes(plan: LabPlan, spec, where: Where) -> list[Node]:
    names = [spec] if isinstance(spec, str) else list(spec)
    out = []
    for name in names:
        if name in GROUPS:
            out += [n for n in plan.nodes if node_kind(n.kind).group == name]
            continue
        try:
            node = plan.node(name)
        except KeyError:
            raise InputError(where, f"{name!r} is not a node of lab {plan.lab!r}",
                             "name nodes, or use gpus / storage (labctl status lists the nodes)") from None
        if node.switching:
            raise InputError(where, f"{name!r} is a {node.kind}; flows run between hosts", "name a host")
        out.append(node)
    if not out:
        raise InputError(where, f"{spec!r} selects no node in lab {plan.lab!r}", "name hosts of this lab")
    return out


def address_toward(plan: LabPlan, src: Node, dst: Node) -> str | None:
    """dst's address on a network src has a NIC in (its frontend NIC for a frontend peer, say)."""
    domain_of = {f: key for key, members in routing_domains(plan.fabrics).items() for f in members}
    mine = {domain_of[i.fabric] for i in src.interfaces}
    for i in dst.interfaces:
        if domain_of[i.fabric] in mine:
            return i.address.split("/")[0]
    return None


SPORT_BASE = 20000   # below the kernel's ephemeral range (32768-60999)


def sequences(plan: LabPlan, flows: list, file: str) -> list[Sequence]:
    out = []
    for k, f in enumerate(flows):
        where = Where(file, key=f"flows.{k}")
        sources, targets = _nodes(plan, f.from_, where), _nodes(plan, f.to, where)
        for i, src in enumerate(sources):
            reach = []
            for dst in targets:
                if dst.name == src.name:
                    continue
                addr = address_toward(plan, src, dst)
                if addr is None:
                    raise InputError(where, f"{src.name} and {dst.name} share no network",
                                     "pick nodes cabled to the same fabric (or routing domain)")
                reach.append(Target(dst.name, dst.namespace, addr))
            if reach:
                out.append(Sequence(f"{f.kind}-{k}", src.name, src.namespace, reach, f.size,
                                    None if f.background else f.count, f.period / 1e9, f.congestion, offset=i,
                                    sport=SPORT_BASE + len(out) if len(out) < 32768 - SPORT_BASE else 0))
    return out
