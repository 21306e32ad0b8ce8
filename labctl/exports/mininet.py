"""`labctl export FILE --format mininet`: a standalone Python script that builds the same lab with
nothing but Mininet's API: every node a Mininet Node (routers and switches forward, as Mininet's
LinuxRouter example does; bridges hold a Linux bridge), every link a TCLink at the lab rate with
labctl's port names, MACs and addresses, and every static route, ECMP next-hops and weights
included. Run as root: no argument opens Mininet's CLI; `--test` builds, pings every pair of end
hosts, stops, and exits 0 only if every pair answered.
"""
from __future__ import annotations

import pprint

from labctl.kinds import fabric_kind, node_kind
from labctl.exports import notes
from labctl.plan.model import LabPlan
from labctl.plan.routing import converged_routes

MININET_BW_MAX = 1000      # Mbit/s: TCLink refuses more


def cannot_express(plan: LabPlan) -> list[str]:
    """What the script leaves out, said in its header."""
    out = ["labctl's PFC/ECN controller (no 802.1Qbb pauses, no ECN marking) and its traffic classes: one "
           "HTB class per port at the link rate",
           f"time dilation {plan.dilation:g}: the script runs the lab rates (real rate / dilation) as they are"]
    capped = [lk for lk in plan.links if lk.lab_rate_bps / 1e6 > MININET_BW_MAX]
    if capped:
        out.append(f"{len(capped)} link(s) faster than Mininet's {MININET_BW_MAX} Mbit/s cap run at that cap")
    if any(lk.lab_delay_ns or lk.lab_jitter_ns or lk.loss for lk in plan.links):
        out.append("link delay, jitter and loss need netem (TCLink delay=, loss=); the WAN line's ordering "
                   "guarantee is not kept")
    if any(lk.encrypt for lk in plan.links):
        out.append("ESP encryption of WAN links: left out")
    if any(fabric_kind(f.kind).credit_based for f in plan.fabrics.values()):
        out.append("NVLink's credit-based flow control (the scale-up fabric is lossy here)")
    out += notes.own_routing(plan)
    return out


def export(plan: LabPlan) -> str:
    routes = converged_routes(plan)
    nodes = [{"name": n.name, "kind": n.kind, "forwards": n.forwarding, "bridge": n.bridged,
              "sysctls": {k: v for k, v in n.sysctls.items() if "multipath" in k or "forward" in k
                          or "rp_filter" in k or "ipv6" in k},
              "loopback": n.loopback,
              "routes": [[r.dst, [[h.via, h.dev, h.weight] for h in r.nexthops]] for r in routes[n.name]]}
             for n in plan.nodes]
    links = []
    for lk in plan.links:
        (a, ia), (b, ib) = lk.ends
        pa, pb = plan.node(a).iface(ia), plan.node(b).iface(ib)
        params = {"bw": round(min(lk.lab_rate_bps / 1e6, MININET_BW_MAX), 3)}
        if lk.lab_delay_ns:
            params["delay"] = f"{lk.lab_delay_ns / 1e6:g}ms"
        if lk.loss:
            params["loss"] = round(lk.loss * 100, 4)
        links.append({"a": a, "a_if": ia, "a_mac": pa.mac, "a_ip": pa.address, "b": b, "b_if": ib, "b_mac": pb.mac,
                      "b_ip": pb.address, "mtu": lk.mtu, **params})
    pairs = []
    for f, spec in plan.fabrics.items():
        island = fabric_kind(spec.kind).islands
        members = [(n, i) for n in plan.nodes if node_kind(n.kind).end_host for i in n.interfaces if i.fabric == f]
        pairs += [[a.name, bi.address.split("/")[0]] for a, _ in members for b, bi in members
                  if a.name != b.name and (not island or getattr(a, island) == getattr(b, island))]
    header = "\n".join(f"  - {x}" for x in cannot_express(plan))
    # Python literals (repr), never JSON: names and addresses reach the script only as quoted strings
    return TEMPLATE.format(lab=plan.lab, header=header, nodes=_literal(nodes), links=_literal(links),
                           pairs=_literal(pairs))


def _literal(value) -> str:
    return pprint.pformat(value, width=110, sort_dicts=False)


TEMPLATE = '''#!/usr/bin/python3
"""Lab {lab!r}, exported by `labctl export --format mininet`: the same nodes, links, addresses,
routes (ECMP next-hops and weights included) and link rates, built with Mininet's API alone.
Debian's and Ubuntu's mininet is a module of the system's Python, hence /usr/bin/python3.

    sudo /usr/bin/python3 THIS_FILE           # Mininet's CLI
    sudo /usr/bin/python3 THIS_FILE --test    # build, ping every pair of end hosts, stop; exit 0 if all answered

What Mininet cannot express, and this script leaves out:
{header}
"""
import sys

from mininet.cli import CLI
from mininet.link import TCLink
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Node

NODES = {nodes}
LINKS = {links}
PAIRS = {pairs}   # [from node, to address] for every pair of end hosts that share a fabric


def build():
    # TCLink logs each kernel warning about HTB's quantum as an error; errors that matter raise
    setLogLevel("critical")
    net = Mininet(topo=None, controller=None, build=False, autoSetMacs=False, waitConnected=False)
    for n in NODES:
        net.addHost(n["name"], cls=Node, ip=None, inNamespace=True)
    for lk in LINKS:
        params = {{k: lk[k] for k in ("bw", "delay", "loss") if k in lk}}
        net.addLink(lk["a"], lk["b"], cls=TCLink, intfName1=lk["a_if"], intfName2=lk["b_if"],
                    addr1=lk["a_mac"], addr2=lk["b_mac"], **params)
    net.build()
    setLogLevel("warning")
    for lk in LINKS:
        for end in ("a", "b"):
            node = net.get(lk[end])
            node.cmd("ip link set dev %s mtu %d" % (lk[end + "_if"], lk["mtu"]))
            if lk[end + "_ip"]:
                node.cmd("ip addr add %s dev %s" % (lk[end + "_ip"], lk[end + "_if"]))
    for n in NODES:
        node = net.get(n["name"])
        for key, value in n["sysctls"].items():
            node.cmd("sysctl -qw %s=%s" % (key, value))
        if n["bridge"]:   # an L2 switch: its ports in one Linux bridge
            node.cmd("ip link add br0 type bridge && ip link set br0 up")
            for intf in node.intfNames():
                if intf != "lo":
                    node.cmd("ip link set %s master br0" % intf)
        if n["loopback"]:
            node.cmd("ip addr add %s dev lo" % n["loopback"])
        for dst, hops in n["routes"]:
            if len(hops) == 1:
                node.cmd("ip route add %s via %s dev %s" % (dst, hops[0][0], hops[0][1]))
            else:
                node.cmd("ip route add %s " % dst + " ".join("nexthop via %s dev %s weight %d" % tuple(h) for h in hops))
    _warn_if_delay_dropped(net)
    return net


def _warn_if_delay_dropped(net):
    """TCLink builds the link even when the kernel has no netem: say so rather than run without
    the delay and loss (netem carries both)."""
    lk = next((lk for lk in LINKS if "delay" in lk or "loss" in lk), None)
    if lk and "netem" not in net.get(lk["a"]).cmd("tc qdisc show dev " + lk["a_if"]):
        print("*** warning: this kernel has no netem (sch_netem): links run without their delay and loss")


def pingall(net):
    failed = [(a, dst) for a, dst in PAIRS if "1 received" not in net.get(a).cmd("ping -c1 -W2 " + dst)]
    for a, dst in failed:
        print("  %s -> %s: no reply" % (a, dst))
    print("*** Results: %d/%d pairs reachable" % (len(PAIRS) - len(failed), len(PAIRS)))
    return not failed


if __name__ == "__main__":
    setLogLevel("warning")
    net = build()
    try:
        ok = pingall(net) if "--test" in sys.argv else (CLI(net) or True)
    finally:
        net.stop()
    sys.exit(0 if ok else 1)
'''
