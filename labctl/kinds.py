"""What each kind of node and fabric is: one table each, asked by every part that behaves by kind.

Adding a node kind is one entry in NODE_KINDS, or `register(NodeKind(...))` from a module of your
own (see the README's "How labctl is built" for a worked example). Nothing else in labctl compares
a node's kind with a string.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeKind:
    name: str
    description: str
    forwards: bool = False        # routes between its ports (gets ECMP routes, ip_forward=1)
    bridges: bool = False         # joins its ports in one Linux bridge: an L2 switch, no addresses
    holds_rank: bool = False      # a GPU: one rank of a collective, one agent
    end_host: bool = False        # has addresses of its own and reaches the fabric through its NICs
    fabric_kind: str | None = None   # the kind of fabric it belongs to when the lab does not say
    shape: str = "ellipse"        # Graphviz shape
    mermaid: tuple[str, str] = ("(", ")")
    group: str | None = None      # how a workload's flows name all nodes of this kind ("gpus", "storage")
    backends: tuple[str, ...] | None = None   # the backends that can build it (None: every one)

    def built_by(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends

    @property
    def switches(self) -> bool:
        """Forwards frames between ports, routed or bridged: it has egress queues to control."""
        return self.forwards or self.bridges


NODE_KINDS: dict[str, NodeKind] = {k.name: k for k in (
    NodeKind("switch", "an L3 switch of a leaf-spine (ECMP, PFC, ECN)", forwards=True, shape="box",
             mermaid=("[", "]")),
    NodeKind("router", "an L3 router, e.g. a DCI router on the WAN", forwards=True, shape="box", mermaid=("[", "]")),
    NodeKind("nvswitch", "the NVLink switch of a server's scale-up domain", forwards=True, fabric_kind="scale-up",
             shape="box3d", mermaid=("[[", "]]")),
    NodeKind("bridge", "a plain L2 switch: a Linux bridge joining its ports into one segment", bridges=True,
             shape="box", mermaid=("[/", "/]")),
    NodeKind("gpu", "a GPU: one rank, one agent, a NIC per fabric", holds_rank=True, end_host=True, group="gpus"),
    NodeKind("storage", "a storage server on the frontend (TCP checkpoints and datasets)", end_host=True,
             shape="cylinder", mermaid=("[(", ")]"), group="storage"),
    NodeKind("host", "any other end host (a scheduler, a client)", end_host=True),
)}


def register(kind: NodeKind) -> NodeKind:
    """Add a node kind: lab files may name it from then on (the schema asks this table)."""
    if kind.name in NODE_KINDS:
        raise ValueError(f"there is already a node kind {kind.name!r}")
    NODE_KINDS[kind.name] = kind
    return kind


def node_kind(name: str) -> NodeKind:
    """The kind called `name`; KeyError if there is none (the schema refuses unknown kinds first)."""
    return NODE_KINDS[name]


def default_fabric_kinds(kind: NodeKind) -> set[str]:
    """The kinds of fabric a switching node joins when the lab names none: its own, or any that no
    node kind claims (a plain switch never lands in an NVLink domain by default)."""
    if kind.fabric_kind:
        return {kind.fabric_kind}
    claimed = {k.fabric_kind for k in NODE_KINDS.values() if k.fabric_kind}
    return set(FABRIC_KINDS) - claimed


@dataclass(frozen=True)
class FabricKind:
    name: str
    description: str
    lossless: bool = False        # the RoCE class pauses instead of dropping, unless the lab says not
    credit_based: bool = False    # link-level credits (NVLink): lossless whatever qos.pfc says
    domain: str | None = None     # fabrics of one routing domain route into each other (named after scale-out)
    joins: bool = False           # ...when a fabric that joins them (the WAN) is in the lab
    islands: str | None = None    # reachable only within one value of this node field ("server")
    path_rank: int = 9            # which shared fabric two GPUs talk over: the lowest
    leaf_spine: bool = False      # its leaves' uplinks are what ECMP balances (plots, metrics)


FABRIC_KINDS: dict[str, FabricKind] = {f.name: f for f in (
    FabricKind("scale-out", "the lossless RoCE leaf-spine", lossless=True, domain="scale-out", path_rank=1,
               leaf_spine=True),
    FabricKind("scale-up", "NVLink inside a server", lossless=True, credit_based=True, islands="server", path_rank=0),
    FabricKind("scale-across", "the WAN between buildings", domain="scale-out", joins=True, path_rank=3),
    FabricKind("frontend", "lossy: storage, checkpoints, management", path_rank=2),
)}


def fabric_kind(name: str) -> FabricKind:
    return FABRIC_KINDS[name]
