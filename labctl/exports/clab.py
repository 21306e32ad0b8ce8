"""`labctl export FILE --format clab`: a containerlab topology of the same lab.

Every node becomes a containerlab `linux` node running labctl's image (`labctl image build host`
makes it; containerlab needs it in the local engine too). Its `exec:` lines, run by containerlab
inside the container after the links exist, set what labctl sets: sysctls, MTUs, addresses, the
loopback, the static routes (ECMP next-hops and weights), a bridge for L2 nodes, and each port's
shaping at the lab rate (one HTB class with a byte-limited bfifo; the shaping
lines leave alone a port that is shaped already, as it is when labctl imports the file back).
Links are brief-form veths with labctl's port names. A container node (but one FRR routes: the
header says so) keeps its image, cmd, env, binds and `cap_add:` (as containerlab's `cap-add:`):
every container key the containerlab import reads comes back from the file as it was. Its
`files:` and `privileged:`, which the import does not read, are not written.

What containerlab cannot express is listed in the file's header; `--strict` refuses such a lab.
"""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import yaml

import labctl

from labctl.errors import LabError
from labctl.exports import notes
from labctl.paths import new_run_dir
from labctl.plan import share
from labctl.plan.share import AGENT_CODE, AGENT_HOME
from labctl.plan.model import Interface, LabPlan, Node
from labctl.plan.routing import converged_routes

IMAGE = "labctl/host"
AGENTS, CODE = "agents", "labctl-agent"
# detached: containerlab waits for each exec line; the agent says "ready" in agent.out
AGENT_LINE = (f"sh -c 'cd / && PYTHONPATH={AGENT_CODE} nohup python3 -P -m labctl.dataplane.agents "
              f"--here {AGENT_HOME} --build > {AGENT_HOME}/agent.out 2> {AGENT_HOME}/agent.log < /dev/null &'")
SYSCTL_KEYS = ("forward", "rp_filter", "multipath", "disable_ipv6", "ignore_routes_with_linkdown")


def cannot_express(plan: LabPlan, agents: bool = False) -> list[str]:
    out = []
    if not agents and any(c.lossless or c.ecn for n in plan.nodes for i in n.interfaces for c in i.shaping.classes):
        out.append("labctl's PFC/ECN controller and its traffic classes (no 802.1Qbb pauses, no ECN marking): "
                   "each port gets one HTB class at the link rate")
    if any(lk.wire for lk in plan.links):
        out.append("the WAN line (delay, loss, jitter, ESP) of links "
                   + ", ".join(f"{lk.a}--{lk.b}" for lk in plan.links if lk.wire)
                   + ": add `containerlab tools netem set` by hand")
    if plan.dilation != 1:
        out.append(f"time dilation {plan.dilation:g}: the links run at the lab rates (real rate / dilation) as they are")
    if any(n.container and n.container.image != IMAGE and n.static_routes for n in plan.nodes):
        out.append("nodes' own images, cmd, env and binds are kept as given; check them for containerlab")
    out += notes.own_routing(plan)
    return out


def export(plan: LabPlan, strict: bool = False, agents: bool = False) -> str:
    """The containerlab file. With `agents` (export_dir writes it, with the shares and code it
    names), every node that needs a switch agent runs one, which carries PFC, ECN and the classes."""
    missing = cannot_express(plan, agents)
    if strict and missing:
        raise LabError(f"containerlab cannot express all of lab {plan.lab!r}: {missing[0]}"
                       + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                       "export without --strict (the file's header lists what is left out)")
    routes = converged_routes(plan)
    served = {n.name for n in share.served(plan)} if agents else set()
    nodes = {n.name: _node(plan, n, routes[n.name], (n.name in served) if agents else None) for n in plan.nodes}
    links = [{"endpoints": [lk.a, lk.b]} for lk in plan.links]
    doc = {"name": plan.lab, "topology": {"nodes": nodes, "links": links}}
    # every labctl image the file names (a BGP lab's FRR too), built before containerlab deploys it
    own = sorted({v["image"].split("/", 1)[1].split(":")[0] for v in nodes.values()
                  if v["image"].startswith("labctl/")})
    builds = " && ".join(f"labctl image build {name}" for name in own)
    header = [f"# lab {plan.lab!r}, exported by `labctl export --format clab`.",
              f"#   {builds + ' && ' if builds else ''}sudo containerlab deploy -t {plan.lab}.clab.yml",
              "# Each node's exec: lines set its sysctls, addresses, routes and shaping, as labctl does."]
    if served:
        header += [f"# PFC, ECN and the traffic classes: {len(served)} nodes run labctl's switch agent (their last",
                   f"# exec: line), from ./{AGENTS}/NODE/{share.SHARE_FILE} and the code in ./{CODE}; it builds the",
                   "# node's classes, pauses and obeys 802.1Qbb frames, marks ECN from the depths it reads, and",
                   f"# reports to ./{AGENTS}/NODE/pfc.json. Its image needs python3-numpy and libnftables1."]
    if missing:
        header.append("# What containerlab cannot express, and this file leaves out:")
        header += [f"#   - {m}" for m in missing]
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False, width=1000)


def export_dir(plan: LabPlan, out: Path, strict: bool = False) -> list[Path]:
    """The lab as a directory containerlab deploys, fabric included: LAB.clab.yml, each served
    node's share (agents/NODE/share.json, reading its depths rather than counting arrivals, which
    needs BPF that containers get only with SYS_ADMIN), and labctl's own package (labctl-agent/),
    which those nodes bind read-only and run their agent from. Returns the files written. `out` is
    made new, as a run directory is (paths.new_run_dir): root writes the files into a directory no
    one else can change, and never removes anything there."""
    new_run_dir(out, "--out", "export")
    topology = out / f"{plan.lab}.clab.yml"
    topology.write_text(export(plan, strict, agents=True))
    written = [topology]
    for own in share.shares(plan):
        own.queue_reads = "poll"
        written.append(share.write(own, out / AGENTS / own.node.name))
    code = Path(labctl.__file__).resolve().parent
    target = out / CODE / "labctl"
    shutil.copytree(code, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    written.append(target)
    return written


def _node(plan: LabPlan, n: Node, routes: list, agent: bool | None = None) -> dict:
    """`agent`: None for a file on its own (labctl export > FILE); in a directory export, whether
    the node runs its switch agent (every GPU there also carries its rank as labels)."""
    own_routing = not n.static_routes and n.numbered     # FRR: exported as the static routes it converges to
    box = n.container if not own_routing else None
    node: dict = {"kind": "linux", "image": box.image if box else IMAGE}
    if box and box.cmd:
        node["cmd"] = shlex.join(box.cmd)    # quoted: containerlab splits cmd as a shell would, as labctl does
    if box and box.env:
        node["env"] = dict(box.env)
    if box and box.binds:
        node["binds"] = list(box.binds)
    if box and box.cap_add:         # read back as cap_add, a powerful line again (plan/trust.py)
        node["cap-add"] = list(box.cap_add)
    lines = [f"sysctl -qew {k}={v}" for k, v in n.sysctls.items() if any(s in k for s in SYSCTL_KEYS)]
    for i in n.interfaces:
        lines.append(f"ip link set dev {i.name} mtu {i.mtu}")
    if n.bridged:
        lines.append("ip link add br0 type bridge")
        lines += [f"ip link set dev {i.name} master br0" for i in n.interfaces]
        lines.append("ip link set dev br0 up")
    # a node numbered by its own exec lines (`addresses: none`, as a containerlab import is) keeps
    # them below: the addresses a running lab learned back from it would be added twice
    lines += [f"ip address add {i.address} dev {i.name}" for i in n.interfaces if i.address and n.numbered]
    if n.loopback:
        lines.append(f"ip address add {n.loopback} dev lo")
    for r in routes:
        if len(r.nexthops) == 1:
            h = r.nexthops[0]
            lines.append(f"ip route add {r.dst} via {h.via} dev {h.dev}")
        else:
            lines.append(f"ip route add {r.dst} " + " ".join(f"nexthop via {h.via} dev {h.dev} weight {h.weight}"
                                                           for h in r.nexthops))
    for i in n.interfaces if not agent else ():     # an agent builds its node's classes itself
        lines += _shaping(i)
    lines += [] if own_routing else [shlex.join(argv) for argv in n.exec]
    if agent:
        node["binds"] = node.get("binds", []) + [f"./{AGENTS}/{n.name}:{AGENT_HOME}", f"./{CODE}:{AGENT_CODE}:ro"]
        lines.append(AGENT_LINE)
    if agent is not None and n.kind == "gpu" and n.rank is not None:
        # read back by labctl's import (topology/clab.py), so that `labctl run` finds the ranks
        node["labels"] = {"labctl.kind": "gpu", "labctl.rank": str(n.rank),
                          **({"labctl.server": n.server} if n.server else {})}
    elif agent is not None and n.forwarding and not n.bridged:
        # a router whose exec lines set its routes: read back as a switch, so that labctl's paths
        # cross it (its agent, carried in the export, does its queueing)
        node["labels"] = {"labctl.kind": "switch"}
    node["exec"] = lines
    return node


def _shaping(i: Interface) -> list[str]:
    """One line per port, run by the image's sh: it shapes a port nothing has shaped yet, so that
    the file also comes up under labctl, whose own HTB tree (with its classes) is there first."""
    s = i.shaping
    tc = (f"tc qdisc add dev {i.name} root handle 1: htb default 1 && "
          f"tc class add dev {i.name} parent 1: classid 1:1 htb rate {s.rate_bps}bit ceil {s.rate_bps}bit "
          f"burst {s.burst_bytes}b quantum {s.quantum} && "
          f"tc qdisc add dev {i.name} parent 1:1 handle 10: bfifo limit {s.buffer_bytes}")
    return [f"sh -c '{_GUARD.format(dev=i.name)} || {{ {tc}; }}'"]


_GUARD = "tc qdisc show dev {dev} root | grep -q htb"
