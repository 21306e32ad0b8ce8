"""What a switch agent sets up itself when it runs where labctl did not build the node (a lab
exported to containerlab, exports/clab.py): it takes its ports' numbers and addresses from the
kernel, by name, and builds its node's traffic classes and DSCP classification from its share.

Under containerlab a port's ifindex and MAC are the runtime's, not the plan's: the share's are
replaced by what the node has. The queues are the plan's, exactly as labctl builds them
(kernel/netconf.py): HTB at the lab rate with a class and a leaf per traffic class, a TBF leaf for
a lossless class (the pause holds it), and on a switch nftables putting packets in their class by
DSCP. Whatever root qdisc the port had (an exported file's single class, or an importer's) goes.
"""
from __future__ import annotations

import errno

from labctl.errors import LabError
from labctl.kernel import netconf, nsutil, rtnl
from labctl.plan.share import NodeShare


def adopt_ports(share: NodeShare) -> None:
    """The share's ifindexes and MACs replaced by the node's own, by port name."""
    node = share.node
    with nsutil.netlink_socket(node.namespace) as sock:
        links = rtnl.link_addresses(sock)
    missing = [i.name for i in node.interfaces if i.name not in links]
    if missing:
        raise LabError(f"{node.name}: ports {', '.join(missing)} of its share are not in this node",
                       "the agent runs in the node its share was written for, once its links exist")
    for i in node.interfaces:
        i.index, mac = links[i.name]
        i.mac = mac or i.mac


def build_queues(share: NodeShare) -> None:
    """The node's traffic classes on every port, and its DSCP classification (a switch's)."""
    node = share.node
    with nsutil.netlink_socket(node.namespace) as sock:
        batch = rtnl.Batch(sock)
        for i in node.interfaces:
            batch.add(rtnl.root_qdisc_del(i.index), f"{node.name}:{i.name}: the root qdisc it had",
                      (errno.ENOENT, errno.EINVAL))
        for i in node.interfaces:
            netconf.add_shaping(batch, node, i)
        netconf.commit(batch)
    netconf.classify(node)
