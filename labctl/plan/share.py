"""A node's share of the plan: everything its switch agent needs, and nothing of the rest of the lab.

The agent (dataplane/controller.py) owns one node's traffic classes, ECN profiles, PFC pause
generation and response. It needs the node itself (ports, classes, thresholds), the MAC of each
neighbour's port (pause frames and kicks are addressed to it), which ingress ports feed each egress
queue (computed here from the whole lab's routes, plan/feeders.py, so the agent never needs them),
and the lab-wide settings its classes fall back on. A share is small, and it is all an agent reads:
one agent can serve one node (inside that node) or every node of the lab, with the same code.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from labctl.plan import feeders as feeding
from labctl.plan.model import EcnPlan, LabPlan, Node, SharedBuffer, _plain, node_from_dict

SHARE_FILE = "share.json"
# inside a container: labctl's package, read-only, and the agent's own directory
AGENT_CODE, AGENT_HOME = "/opt/labctl", "/run/labctl-agent"
# where agents run: one on the host for the lab, or one inside each node that needs one
PLACEMENT_ENV = "LABCTL_SWITCH_AGENTS"
PLACEMENTS = ("lab", "node")


@dataclass
class NodeShare:
    lab: str
    node: Node
    peer_macs: dict[str, str]        # own port name -> the MAC of the neighbour's port on that link
    feeders: dict[str, list[str]]    # egress port -> ingress ports whose traffic can queue there
    ecn: EcnPlan
    shared_buffer: SharedBuffer | None
    queue_reads: str                 # "arrivals" or "poll" (dataplane/arrivals.py)

    @property
    def lossless(self) -> list:
        """Its (interface, class) pairs that PFC protects."""
        return [(i, c) for i in self.node.interfaces for c in i.shaping.classes if c.lossless]

    @property
    def marking(self) -> list[tuple[int, int]]:
        """(ifindex, tc) of each class it marks ECN on (a switch's only: hosts do not queue for others)."""
        if not self.node.switching:
            return []
        return [(i.index, c.tc) for i in self.node.interfaces for c in i.shaping.classes if c.ecn]

    def to_dict(self) -> dict:
        return _plain(self)

    @classmethod
    def from_dict(cls, d: dict, lab: str | None = None) -> "NodeShare":
        """A share read back; ValueError (from node_from_dict) if its namespace is not one of `lab`'s."""
        lab = lab or d["lab"]
        if d["lab"] != lab:
            raise ValueError(f"a share of lab {d['lab']!r} is not one of lab {lab!r}")
        return cls(d["lab"], node_from_dict(d["node"], lab), {str(k): str(v) for k, v in d["peer_macs"].items()},
                   {str(k): [str(x) for x in v] for k, v in d["feeders"].items()}, EcnPlan(**d["ecn"]),
                   SharedBuffer(**d["shared_buffer"]) if d.get("shared_buffer") else None, d["queue_reads"])


def placement() -> str:
    """Where `up` places the agents now (LABCTL_SWITCH_AGENTS, else one agent for the lab)."""
    from labctl.errors import InputError, Where
    value = os.environ.get(PLACEMENT_ENV, "lab") or "lab"
    if value not in PLACEMENTS:
        raise InputError(Where("environment", key=PLACEMENT_ENV), f"{value!r} is not a placement of switch agents",
                         f"set {PLACEMENT_ENV} to 'lab' (one agent on the host serves every node) or 'node' "
                         "(an agent inside each node that needs one)")
    return value


def needs_agent(node: Node) -> bool:
    """A switch that marks ECN, or any node with a lossless class (a host obeys its switch's pauses)."""
    return any(c.lossless or (c.ecn and node.switching) for i in node.interfaces for c in i.shaping.classes)


def carries_agent(node: Node) -> bool:
    """A container node that binds a directory of its own at AGENT_HOME: it runs the agent a
    containerlab export carries (exports/clab.py), which builds its classes and marks ECN itself,
    so labctl starts no agent for it and attaches no marking program to it."""
    c = node.container
    return c is not None and any(b.split(":")[1:2] == [AGENT_HOME] for b in c.binds)


def served(plan: LabPlan) -> list[Node]:
    """The nodes that need an agent from labctl."""
    return [n for n in plan.nodes if needs_agent(n) and not carries_agent(n)]


# One node's agent, resident (bench/agent_placement.py: 519 MiB for the bundled lab's 16 agents)
AGENT_MIB = 32


def memory_refusal(plan: LabPlan, available_bytes: int | None) -> tuple[str, str] | None:
    """(reason, fix) when the lab's agents, one in each node, would not fit in `available_bytes`
    (this host's MemAvailable: procs.mem_available), else None. `up` asks before anything is built:
    1,200 agents (the 1,024-GPU lab) need about 37.5 GiB, and a machine short of that swaps to a
    halt."""
    placed = any(n.machine for n in plan.nodes)
    if placement() != "node" and not placed:
        return None
    count = len(served(plan))
    need = count * AGENT_MIB * 2**20
    if available_bytes is None or need <= 0.8 * available_bytes:
        return None
    return (f"an agent in each of {count} nodes needs about {need / 2**30:.1f} GiB, and this host has "
            f"{available_bytes / 2**30:.1f} GiB available (each agent holds about {AGENT_MIB} MiB)",
            "place fewer nodes on the machines: a placed lab runs an agent in each node" if placed else
            f"unset {PLACEMENT_ENV} (or set it to 'lab'): one agent on the host serves every node")


def shares(plan: LabPlan, nodes: list[Node] | None = None) -> list[NodeShare]:
    """The share of each of `nodes` (default: every node that needs an agent)."""
    macs = {(n.name, i.name): i.mac for n in plan.nodes for i in n.interfaces}
    out = []
    for node in served(plan) if nodes is None else nodes:
        feeds = feeding.feeders(plan, node) if node.switching else {}
        out.append(NodeShare(plan.lab, node, {i.name: macs[(i.peer_node, i.peer_iface)] for i in node.interfaces},
                             {e: sorted(f) for e, f in feeds.items()}, plan.ecn, plan.shared_buffer,
                             plan.queue_reads))
    return out


def write(share: NodeShare, directory: Path) -> Path:
    """The share as `directory`/share.json (the agent's own directory in the lab's). Written
    beside and renamed into place: the directory may be bound into a container that started
    first, and a share.json it made a link to elsewhere is replaced, never followed."""
    import tempfile
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SHARE_FILE
    fd, tmp = tempfile.mkstemp(prefix=".share-", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(share.to_dict(), f)
    os.replace(tmp, path)
    return path


def read(path: Path, lab: str | None = None) -> NodeShare:
    return NodeShare.from_dict(json.loads(Path(path).read_text()), lab)
