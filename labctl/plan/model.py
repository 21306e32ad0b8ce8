"""The LabPlan: everything the backend will create, as plain data (serialised to plan.json)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

from labctl.names import split_endpoint
from labctl.plan.flowhash import FlowHash


@dataclass
class ClassPlan:
    """One traffic class on one port: HTB class 1:(0x10+tc) with a bfifo leaf (plan/qos.py)."""
    name: str
    tc: int
    dscp: list[int]
    rate_bps: int        # guaranteed: the class's weight share of the link; ceil is the link
    prio: int            # HTB prio: 0 for strict classes, 1 for weighted ones
    buffer_bytes: int
    lossless: bool       # PFC protects it here (the class is lossless and so is the port's fabric)
    ecn: bool
    xoff_bytes: int = 0  # lossless: queue depth at which this port pauses its feeders
    xon_bytes: int = 0   # and at which it lets them go again
    pfc_quanta: int = 0xFFFF
    kmin_bytes: int = 0  # ECN: where marking starts on this port (the lab's profile, scaled to the link's rate)
    kmax_bytes: int = 0  # and where it reaches Pmax; 0 (a plan from before thresholds were per port): the profile's


@dataclass
class Shaping:
    """Egress queueing of one port: HTB at the lab (dilated) rate, a class per traffic class."""
    rate_bps: int        # lab rate = real rate / dilation
    burst_bytes: int     # ≈ 1 ms of rate: tc's default burst loses 25% at 1 Gbit/s (docs/design.md §8)
    quantum: int
    buffer_bytes: int
    classes: list[ClassPlan] = field(default_factory=list)
    overhead_bytes: int = 0   # added to every packet's size by the shaper: ESP's, on an encrypted link


@dataclass
class Interface:
    name: str
    index: int           # ifindex, fixed so one netlink batch can use it (see compile.link_ifindex)
    mac: str
    mtu: int
    address: str         # a.b.c.d/31 on a point-to-point link, the segment's prefix on a bridge; "" on a bridge's own port
    peer_node: str
    peer_iface: str
    peer_address: str    # "" when the peer is a bridge (its neighbours are the segment's members)
    link: int            # index into LabPlan.links
    fabric: str
    shaping: Shaping
    delay_ns: int        # lab one-way delay (latency x dilation); applied by the WAN delay line


@dataclass
class NextHop:
    via: str
    dev: str
    weight: int = 1      # ECMP weight (the link's `weight:`)


@dataclass
class Route:
    dst: str
    nexthops: list[NextHop]


@dataclass
class TeRoute:
    """One te: rule of a router, as built (plan/te.py): packets its program marks `mark` look up
    table `table` first (fib rule priority `pref`), which holds the router's multipath routes over
    the rule's paths only; a destination none of them reaches falls through to the main table."""
    rule: str            # the rule as the lab file writes it, for `labctl route`
    mark: int
    table: int
    pref: int
    paths: list[str]
    weights: list[int]
    routes: list[Route] = field(default_factory=list)


@dataclass
class Container:
    """A node that runs in a Docker container: started with no network of Docker's, its netns then
    exposed as the node's named netns and cabled like any other (containers/nodes.py)."""
    name: str            # the Docker container's name: labctl-<lab>-<node>
    image: str
    cmd: list[str] | None
    env: dict[str, str]
    binds: list[str]     # host:container[:ro], host paths absolute
    files: list[dict] = field(default_factory=list)   # {path, text}: written to the lab directory, bound read-only
    privileged: bool = False    # Docker's privileged mode (a powerful line, plan/trust.py)
    cap_add: list[str] = field(default_factory=list)   # capabilities beyond containers/nodes.py's set
    chosen: bool = False        # labctl's own choice for a placed node the lab file runs in no container


@dataclass
class Node:
    name: str
    kind: str
    namespace: str
    index: int
    forwarding: bool
    fabric: str | None
    server: str | None
    rank: int | None
    loopback: str | None
    sysctls: dict[str, str]
    interfaces: list[Interface] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    zone: str | None = None
    bridged: bool = False      # an L2 switch: its ports are one Linux bridge and have no addresses
    container: Container | None = None
    exec: list[list[str]] = field(default_factory=list)   # argv lists run inside the node after it is cabled
    static_routes: bool = True   # False: it routes for itself (FRR), labctl installs no routes there
    numbered: bool = True        # False: its exec lines address its ports, the plan gives them none
    flow_hash: FlowHash | None = None   # labctl's ECMP hash on its ports (kernels without a seed: plan/flowhash.py)
    te: list[TeRoute] = field(default_factory=list)   # WAN traffic engineering (plan/te.py)
    machine: str | None = None   # the machine it runs on (plan/placement.py); None: this one

    @property
    def switching(self) -> bool:
        """Forwards between its ports (routed or bridged), so it has egress queues to control."""
        return self.forwarding or self.bridged

    def iface(self, name: str) -> Interface:
        for i in self.interfaces:
            if i.name == name:
                return i
        raise KeyError(f"{self.name} has no interface {name!r}")


@dataclass
class Wire:
    """A link carried by a user-space line (delay, loss, jitter, ESP) instead of one veth pair:
    a:port -- [near ns] a | fibre -- fibre | b [far ns] -- b:port, the line process in between."""
    near: str            # namespace next to the link's a end
    far: str             # namespace next to its b end
    near_index: int      # ifindex of the near namespace's port toward a (differs from a's, docs/design.md §8)
    far_index: int
    fibre_mtu: int       # room for ESP's overhead on a full-size frame


@dataclass
class Link:
    id: int
    a: str               # node:iface
    b: str
    fabric: str
    subnet: str
    rate_bps: int        # the real fabric's rate
    lab_rate_bps: int
    latency_ns: int      # the real fabric's one-way delay
    lab_delay_ns: int
    mtu: int
    loss: float = 0.0
    lab_jitter_ns: int = 0
    encrypt: bool = False
    weight: int = 1
    wire: Wire | None = None   # the delay line that carries this link (WAN), if any
    machines: list[str] | None = None   # [machine of a, machine of b] when they differ: a VXLAN carries it

    @property
    def ends(self) -> tuple[tuple[str, str], tuple[str, str]]:
        """((node, iface), (node, iface)) of its two ends (names.split_endpoint of a and b)."""
        return endpoint(self.a), endpoint(self.b)

    @property
    def nodes(self) -> tuple[str, str]:
        """The names of the two nodes it joins."""
        return endpoint(self.a)[0], endpoint(self.b)[0]


def endpoint(text: str) -> tuple[str, str]:
    """A planned link end, NODE:IFACE (always both: the compiler names every port)."""
    node, iface = split_endpoint(text)
    return node, iface or ""


@dataclass
class Segment:
    """An L2 segment: bridge nodes joined by their links, with every port cabled to them. Its member
    ports (those of non-bridge nodes) share one subnet; the bridges' own ports have no address."""
    id: int
    fabric: str
    subnet: str
    bridges: list[str]
    links: list[int]


@dataclass
class FabricPlan:
    kind: str
    lossless: bool
    prefix: str
    loopbacks: str


@dataclass
class EcnPlan:
    kmin: int
    kmax: int
    pmax: float
    rate_bps: int | None = None   # the link rate kmin/kmax are for: each port's scale with its rate (ClassPlan)


@dataclass
class SharedBuffer:
    """Each switch's buffer shared by its lossless queues, with a dynamic XOFF (pfc.dynamic_xoff)."""
    bytes: int
    alpha: float


@dataclass
class LabPlan:
    lab: str
    description: str
    dilation: float
    template: str | None
    fabrics: dict[str, FabricPlan]
    nodes: list[Node]
    links: list[Link]
    ecn: EcnPlan = field(default_factory=lambda: EcnPlan(400_000, 1_600_000, 0.2))
    shared_buffer: SharedBuffer | None = None
    pfc_response_s: float = 0.02   # lab time from XOFF to stopped feeders the headroom is sized for
    segments: list[Segment] = field(default_factory=list)
    queue_reads: str = "poll"      # how the controller finds busy queues: "poll" or "arrivals" (dataplane/arrivals.py)
    notes: list[str] = field(default_factory=list)   # located remarks on the lab file (plan/buffers.py)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def to_dict(self) -> dict:
        out = _plain(self)
        # a lab without te: rules writes the plan it wrote before they existed (from_dict defaults them)
        for n in out["nodes"]:
            if not n["te"]:
                del n["te"]
            if n["machine"] is None:          # an unplaced lab writes the plan it wrote before placement
                del n["machine"]
            if n["container"] and not n["container"]["chosen"]:
                del n["container"]["chosen"]
            if n["flow_hash"] and not n["flow_hash"]["te"]:
                del n["flow_hash"]["te"]
        for lk in out["links"]:
            if lk["machines"] is None:
                del lk["machines"]
        if not out["notes"]:
            del out["notes"]
        return out

    @classmethod
    def from_lab_dir(cls, lab_dir) -> "LabPlan":
        """The plan a lab was built from (plan.json in its directory), as the lab's processes read it."""
        import json
        from pathlib import Path
        return cls.from_dict(json.loads((Path(lab_dir) / "plan.json").read_text()))

    @classmethod
    def from_dict(cls, d: dict) -> "LabPlan":
        """A plan read back from plan.json; ValueError if a namespace in it is not one labctl would
        have named for this lab (every labctl command enters and deletes the namespaces it lists)."""
        from labctl.names import valid_lab_name, valid_namespace
        if not valid_lab_name(d.get("lab")):
            raise ValueError(f"plan.json names lab {d.get('lab')!r}, which is not a lab name")
        spaces = [n["namespace"] for n in d["nodes"]] + [lk["wire"][k] for lk in d["links"] if lk.get("wire")
                                                           for k in ("near", "far")]
        bad = [ns for ns in spaces if not valid_namespace(ns, d["lab"])]
        if bad:
            raise ValueError(f"plan.json lists namespace {bad[0]!r}, which is not one of lab {d['lab']!r}'s")
        nodes = [node_from_dict(n) for n in d["nodes"]]
        return cls(d["lab"], d["description"], d["dilation"], d["template"],
                   {k: FabricPlan(**v) for k, v in d["fabrics"].items()}, nodes,
                   [Link(**{**lk, "wire": Wire(**lk["wire"]) if lk.get("wire") else None}) for lk in d["links"]], EcnPlan(**d["ecn"]) if "ecn" in d else EcnPlan(
                       400_000, 1_600_000, 0.2),
                   SharedBuffer(**d["shared_buffer"]) if d.get("shared_buffer") else None,
                   d.get("pfc_response_s", 0.02), [Segment(**g) for g in d.get("segments", [])],
                   d.get("queue_reads", "poll"), list(d.get("notes", [])))


def node_from_dict(n: dict, lab: str | None = None) -> Node:
    """A node read back from plan.json or a node's share (plan/share.py); with `lab`, ValueError if
    its namespace is not one labctl would have named for that lab."""
    if lab is not None:
        from labctl.names import valid_namespace
        if not valid_namespace(n.get("namespace"), lab):
            raise ValueError(f"node {n.get('name')!r} names namespace {n.get('namespace')!r}, "
                             f"which is not one of lab {lab!r}'s")
    ifaces = [Interface(**{**i, "shaping": Shaping(**{**i["shaping"], "classes": [
        ClassPlan(**c) for c in i["shaping"].get("classes", [])]})}) for i in n["interfaces"]]
    routes = [Route(r["dst"], [NextHop(**h) for h in r["nexthops"]]) for r in n["routes"]]
    container = Container(**n["container"]) if n.get("container") else None
    flow_hash = FlowHash(**n["flow_hash"]) if n.get("flow_hash") else None
    te = [TeRoute(**{**t, "routes": [Route(r["dst"], [NextHop(**h) for h in r["nexthops"]])
                                     for r in t["routes"]]}) for t in n.get("te", [])]
    return Node(**{**n, "interfaces": ifaces, "routes": routes, "container": container,
                   "flow_hash": flow_hash, "te": te})


_FIELDS: dict[type, tuple[str, ...]] = {}
_SCALARS = (str, int, float, bool, type(None))


def _plain(obj):
    """Like dataclasses.asdict without its deep copies; field names are looked up once per class
    (a 1,024-GPU plan has 2.9 million values: 12.8 s with fields() on each, a few s without)."""
    if isinstance(obj, _SCALARS):
        return obj
    names = _FIELDS.get(type(obj))
    if names is None and is_dataclass(obj):
        names = _FIELDS[type(obj)] = tuple(f.name for f in fields(obj))
    if names is not None:
        return {n: _plain(getattr(obj, n)) for n in names}
    if isinstance(obj, list):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj
