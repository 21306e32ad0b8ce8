"""Runtime changes to a port's queueing: its rate (HTB classes changed in place)."""
from __future__ import annotations

from labctl.backends import rtnl
from labctl.backends.netns import commit_in
from labctl.dataplane import qos
from labctl.plan.model import Interface, Node

CHANGE = rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK  # RTM_NEWTCLASS without CREATE: change an existing class


def set_port_rate(node: Node, iface: Interface, rate_bps: int) -> None:
    """Shape a port to `rate_bps`: the link class and every traffic class's ceil, shares kept."""
    s = iface.shaping
    burst = max(rate_bps // 8 // 1000, 2 * s.quantum)
    specs = [{"weight": max(1, c.rate_bps), "tc": c.tc} for c in s.classes]
    shares = qos.class_rates(specs, rate_bps) if specs else []
    kind, _, body = rtnl.htb_class(iface.index, qos.HTB_LINK, qos.HTB_ROOT, rate_bps, burst, s.quantum)
    requests = [((kind, CHANGE, body), f"{node.name}:{iface.name}: link class")]
    for c, share in zip(s.classes, shares):
        kind, _, body = rtnl.htb_class(iface.index, qos.class_handle(c.tc), qos.HTB_LINK, share, burst,
                                       s.quantum, prio=c.prio, ceil_bps=rate_bps)
        requests.append(((kind, CHANGE, body), f"{node.name}:{iface.name}: class {c.name}"))
    commit_in(node.namespace, requests)
