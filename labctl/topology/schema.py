"""Typed model of a lab file. Field descriptions double as the hints printed with validation errors."""
from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from labctl import kinds
from labctl.capabilities import CAPABILITIES
from labctl.units import parse_duration_ns, parse_rate, parse_size

NAME_PATTERN = r"^[a-z][a-z0-9_-]*$"
# a Docker image reference: [registry[:port]/]repo[:tag][@digest]; never starts with '-' (an option)
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"

Rate = Annotated[int, BeforeValidator(parse_rate), Field(gt=0, description="a rate such as 400G or 100Mbit")]
def _duration_to_1s(value) -> int:
    """A delay of at most a second, refused with its unit named: the bound's own message said
    "less than or equal to 1000000000 (got 5)", with no unit on either side."""
    ns = parse_duration_ns(value)
    if ns > 10**9:
        raise ValueError(f"{value!r} is {ns / 1e9:g} s, over the 1 s a delay may be (a number without a unit "
                         "is seconds): write the unit, e.g. 5ms or 5us")
    return ns


Duration = Annotated[int, BeforeValidator(_duration_to_1s),
                     Field(ge=0, le=10**9, description="a duration such as 2us or 5ms, at most 1s")]
Size = Annotated[int, BeforeValidator(parse_size), Field(gt=0, description="a size such as 1MiB or 9000")]
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=40,
                            description="lower-case letters, digits, '-' and '_', starting with a letter")]

FABRIC_KINDS = tuple(kinds.FABRIC_KINDS)


def _known_kind(name: str) -> str:
    # asked at validation time, not frozen at import: kinds.register adds kinds
    if name not in kinds.NODE_KINDS:
        raise ValueError(f"not a node kind: one of {', '.join(kinds.NODE_KINDS)}")
    return name


NodeKindName = Annotated[str, AfterValidator(_known_kind)]


def _capability(name: str) -> str:
    """A capability(7) name as Docker writes it: NET_RAW, not CAP_NET_RAW or net_raw."""
    if name in CAPABILITIES:
        return name
    bare = name.upper().removeprefix("CAP_")
    if bare in CAPABILITIES:
        raise ValueError(f"write {bare}, not {name!r} (upper case, without CAP_)")
    if bare == "ALL":
        raise ValueError("ALL is not a capability: write `privileged: true` if the node needs every one")
    raise ValueError(f"{name!r} is not a capability labctl knows: one of {', '.join(CAPABILITIES)}")


Capability = Annotated[str, AfterValidator(_capability)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Defaults(Strict):
    mtu: int = Field(9000, ge=1280, le=9000, description="interface MTU in bytes, 1280..9000")
    rate: Rate = Field(100_000_000_000, description="link rate of the real fabric, e.g. 400G")
    latency: Duration = Field(0, description="one-way propagation delay of a link, e.g. 1us")
    buffer: Size = Field(4 * 1024 * 1024, description="the least egress buffer of a delayed link's ports (a "
                         "WAN's, with the bandwidth-delay product), e.g. 4MiB; fabric ports take "
                         "qos.classes[k].buffer")


LB_MODES = ("ecmp", "ecmp-qp", "spray", "adaptive")


def _lb_mode(text: str) -> str:
    """A load-balancing mode: ecmp, ecmp-qp, flowlet:GAP (fabric time, e.g. flowlet:50us), spray, adaptive."""
    if text in LB_MODES:
        return text
    if text.startswith("flowlet:"):
        gap = parse_duration_ns(text.split(":", 1)[1])
        if not 0 < gap <= 10**9:
            raise ValueError(f"a flowlet gap is more than 0 and at most 1s of fabric time, not {text.split(':', 1)[1]!r}")
        return text
    if text == "flowlet":
        raise ValueError("flowlet needs its gap in fabric time: flowlet:GAP, e.g. flowlet:50us")
    raise ValueError(f"{text!r} is not a load-balancing mode: one of ecmp, ecmp-qp, flowlet:GAP (e.g. "
                     "flowlet:50us), spray, adaptive")


LbMode = Annotated[str, AfterValidator(_lb_mode)]


class Routing(Strict):
    hash_policy: Literal[0, 1] = Field(1, description="0 = L3 (addresses), 1 = L4 (the 5-tuple, as a switch hashes)")
    hash_seed: int = Field(1, ge=1, lt=2**32,
                           description="fib_multipath_hash_seed, fixed so ECMP spreads are reproducible")
    lb: LbMode | dict[Literal["leaf", "spine"], LbMode] | None = Field(
        None, description="load balancing: one mode for every router, or per tier {leaf: MODE, spine: MODE} "
                          "(a leaf has an end host cabled to it); modes: ecmp, ecmp-qp, flowlet:GAP, spray, "
                          "adaptive. Unset: the kernel's ECMP hash")


class TrafficClass(Strict):
    name: Name
    tc: int = Field(ge=0, le=7, description="the traffic class (802.1p priority) 0..7")
    dscp: list[int] = Field(default_factory=list, description="DSCP values mapped to this class; "
                                                              "the class with none takes everything else")
    lossless: bool = Field(False, description="PFC protects this class (on fabrics marked lossless)")
    ecn: bool = Field(False, description="mark ECT packets CE on queue depth (the ecn: profile)")
    strict: bool = Field(False, description="strict priority over the weighted classes")
    weight: int = Field(1, ge=1, le=100, description="share of the link among non-strict classes, 1..100")
    buffer: Size = Field(4 * 1024 * 1024, description="this class's egress buffer per port, e.g. 4MiB")
    headroom: Size | None = Field(None, description="lossless: buffer kept above XOFF for in-flight data "
                                                    "(default: feeders x rate x (2 x delay + the controller's reaction, 30 ms) + 2 MTU)")


class EcnProfile(Strict):
    kmin: Size = Field(400_000, description="queue depth where marking starts, e.g. 400KB")
    kmax: Size = Field(1_600_000, description="queue depth where the probability reaches pmax, e.g. 1600KB")
    pmax: float = Field(0.2, gt=0, le=1, description="marking probability at kmax (1 above it)")
    rate: Rate | None = Field(None, description="the link rate kmin and kmax are given for, e.g. 100G: each "
                                                "port's thresholds then scale with its link's rate (a 400G "
                                                "port marks from 4 x kmin). Unset: the same bytes at every rate")


def default_classes() -> list[TrafficClass]:
    """RoCE data (DSCP 26) lossless and ECN-capable; CNP/control (DSCP 48) strict; the rest lossy."""
    return [TrafficClass(name="roce", tc=3, dscp=[26], lossless=True, ecn=True, weight=70),
            TrafficClass(name="cnp", tc=6, dscp=[48], strict=True, weight=10, buffer=256 * 1024),
            TrafficClass(name="default", tc=0, weight=20)]


class Qos(Strict):
    classes: list[TrafficClass] = Field(default_factory=default_classes, min_length=1)
    ecn: EcnProfile = EcnProfile()
    pfc: bool = Field(True, description="PFC on the lossless classes of lossless fabrics (false: all lossy)")
    pfc_quanta: int = Field(0xFFFF, ge=1, le=0xFFFF, description="pause time sent at XOFF, in 512-bit quanta")
    pfc_response: Duration | None = Field(None, description="the controller's worst reaction (lab time from XOFF "
                                                            "to stopped feeders) the PFC headroom is sized for, "
                                                            "e.g. 200ms; default 30ms, measured on 2 cores. Raise "
                                                            "it where the controller runs slower (an emulated CPU)")
    shared_buffer: Size | None = Field(None, description="per switch: buffer the lossless queues of all its ports "
                                                         "share, e.g. 8MB; a queue then pauses its feeders past "
                                                         "shared_alpha x (shared_buffer - used), if below its XOFF")
    shared_alpha: float = Field(1.0, gt=0, le=64, description="dynamic threshold factor of the shared buffer")


class Fabric(Strict):
    kind: Literal[FABRIC_KINDS] = Field(description="one of " + ", ".join(FABRIC_KINDS))
    description: str = ""
    lossless: bool | None = Field(None, description="PFC on the RoCE class (default: true for scale-out and "
                                    "scale-up; false makes an NVLink fabric drop instead of pausing)")
    prefix: ipaddress.IPv4Network | None = Field(None, description="address pool for /31 links, e.g. 10.1.0.0/16")
    loopbacks: ipaddress.IPv4Network | None = Field(None, description="pool for router loopbacks, e.g. 10.101.0.0/24")

    @field_validator("prefix", "loopbacks")
    @classmethod
    def _usable_pool(cls, net, info):
        if net is None:
            return net
        if net.is_loopback or net.is_multicast or net.is_link_local or net.is_reserved or net.is_unspecified \
                or net.network_address == ipaddress.IPv4Address("0.0.0.0"):
            raise ValueError(f"{net} is not a unicast pool a lab can number its ports from "
                             "(loopback, multicast, link-local, reserved and 0/8 are not)")
        if info.field_name == "prefix" and net.prefixlen > 31:
            raise ValueError(f"{net} cannot hold a /31 link; give a pool of /31 or larger, e.g. 10.1.0.0/16")
        return net


class NodeFile(Strict):
    template: str = Field(description="a Jinja template rendered with this node as planned (node.name, "
                                      "node.loopback, node.interfaces...), e.g. lib/frr/bgp.conf.j2: a path in the "
                                      "lab's template tree, or next to the lab file")
    vars: dict[Name, str | int | float | bool] = Field(default_factory=dict, description="more variables for it")


class TeRule(Strict):
    """One WAN traffic-engineering rule of a router (plan/te.py): which packets, and where they go."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    class_: Name | None = Field(None, alias="class", description="a traffic class of qos.classes (by name): "
                                "its DSCP values match (the class with none: every other DSCP)")
    dport: int | None = Field(None, ge=1, le=65535, description="a TCP or UDP destination port, e.g. 4791 "
                              "(RoCEv2); with class:, both must match")
    path: str | list[str] | None = Field(None, description="the port of this router the packets leave by, among "
                                         "its multipath next hops (ports are named after their peer, e.g. "
                                         "z2-dci1-2), or a list: one per place (a zone) they lead to")
    weights: dict[str, Annotated[int, Field(ge=1, le=256)]] | None = Field(
        None, description="or several ports and the share of flows each takes, e.g. {z2-dci1: 4, z2-dci1-2: 1}")


class NodeSpec(Strict):
    """A node as the lab file writes it (compiled into plan.model.Node; api.Node drives a running one)."""
    kind: NodeKindName = Field(description="one of " + ", ".join(kinds.NODE_KINDS))
    fabric: Name | None = Field(None, description="the fabric a switch or router belongs to")
    server: Name | None = Field(None, description="the server a GPU sits in (GPUs of a server share scale-up)")
    rank: int | None = Field(None, ge=0, le=1_000_000, description="the GPU's global rank, 0..1000000")
    zone: Name | None = Field(None, description="the building (AI zone) it stands in; zones meet over the WAN")
    description: str = ""
    image: str | None = Field(None, max_length=256, pattern=IMAGE_PATTERN,
                              description="a container image: the node runs in a Docker container with no network "
                                          "of Docker's, and labctl cables its netns (`labctl image build host` "
                                          "makes one without a registry)")
    cmd: str | list[str] | None = Field(None, description="the container's command (default: the image's), "
                                                          "a string split as a shell would, or a list")
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(
        default_factory=dict, description="environment variables of the container, NAME: value")
    binds: list[str] = Field(default_factory=list, description="host:container[:ro] bind mounts of the "
                                                               "container (host paths relative to the lab file)")
    privileged: bool = Field(False, description="run the container privileged (Docker's --privileged: every "
                                                "capability, every device, no seccomp or AppArmor): a powerful "
                                                "line, so `up` needs a trusted lab or --trust")
    cap_add: list[Capability] = Field(default_factory=list, max_length=len(CAPABILITIES),
                                      description="capabilities added to the container's, e.g. [SYS_PTRACE]: "
                                                  "powerful lines, so `up` needs a trusted lab or --trust")
    files: dict[Annotated[str, Field(pattern=r"^/[A-Za-z0-9._/-]+$", max_length=256)], str | NodeFile] = Field(
        default_factory=dict, description="files put into the container, read-only: /path: text, or "
                                          "/path: {template: ..., vars: {...}} rendered from the plan")
    exec: list[str] = Field(default_factory=list, description="commands run in the node once its links exist, "
                                                             "in order (split as a shell would; no shell runs them)")
    routes: Literal["static", "none"] = Field("static", description="static: labctl installs shortest-path ECMP "
                                              "routes; none: the node routes for itself (e.g. FRR)")
    lb: LbMode | None = Field(None, description="this router's load-balancing mode, over its tier's "
                                                "(routing.lb): ecmp, ecmp-qp, flowlet:GAP, spray or adaptive")
    te: list[TeRule] = Field(default_factory=list, description="traffic engineering: rules {class: NAME | "
                             "dport: PORT, path: PORT | weights: {PORT: W}}, the first that matches a packet "
                             "decides which of this router's multipath next hops it may take")
    addresses: Literal["auto", "none"] = Field("auto", description="auto: labctl numbers the node's ports; none: "
                                               "its exec: lines do (its links get no addresses, and it no routes)")


class Link(Strict):
    endpoints: list[str] = Field(min_length=2, max_length=2,
                                 description="two endpoints, `node` or `node:iface`")
    rate: Rate | None = Field(None, description="the real link rate, e.g. 400G (the lab runs it / dilation)")
    latency: Duration | None = Field(None, description="one-way propagation delay, e.g. 2us")
    mtu: int | None = Field(None, ge=1280, le=9000, description="MTU for this link, 1280..9000")
    fabric: Name | None = Field(None, description="the fabric this link belongs to (normally inferred)")
    distance: float | None = Field(None, ge=0, le=20_000,
                                   description="fibre length in km: one-way delay 4.9 us/km (a WAN link; needs rate:)")
    loss: float = Field(0.0, ge=0, lt=1, description="fraction of frames the line loses at random, e.g. 0.001")
    jitter: Duration | None = Field(None, description="random extra one-way delay up to this, order kept, e.g. 20us")
    buffer: Size | None = Field(None, description="egress buffer of every class at both ends, at least one "
                                                  "frame (default: on delayed links the larger of the "
                                                  "bandwidth-delay product and defaults.buffer, else each "
                                                  "class's own)")
    encrypt: bool = Field(False, description="ESP (AES-GCM) between the two ends; keys in the lab directory")
    weight: int = Field(1, ge=1, le=256, description="ECMP weight of this link's next hop (unequal-cost multipath)")


class TopologySpec(Strict):
    """A lab file, validated (topology/builder.Topology writes one from Python; plan/ compiles it)."""
    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$", max_length=24,
                      description="the lab name: lower-case letters, digits and '-', at most 24 characters")
    description: str = ""
    dilation: float = Field(1000.0, gt=0, le=1e6,
                            description="time dilation D (default 1000): lab rates are real rates / D, "
                                        "lab times real times x D; 400G ports at D=1000 run at 400 Mbit/s")
    defaults: Defaults = Defaults()
    routing: Routing = Routing()
    fabrics: dict[Name, Fabric] = Field(default_factory=lambda: {"backend": Fabric(kind="scale-out")})
    nodes: dict[Name, NodeSpec] = Field(min_length=1, description="at least one node")
    links: list[Link] = Field(default_factory=list)
    qos: Qos = Qos()
    placement: dict[str, Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,15}$")]] = Field(
        default_factory=dict, description="the machines the nodes run on (labctl cluster): NAME: MACHINE, where "
                                          "NAME is a node, a server (its GPUs and NVLink switch), a zone, or '*' "
                                          "for every other node; each node then runs as a container on its "
                                          "machine, and links between machines are VXLAN")
