"""The compile pass of placement (topology/placement.py resolves the lab file's): each node's
machine, and the container a placed node runs in. Each link whose ends are on two machines is then
a point-to-point VXLAN between them (compile.tunnels, cluster/vxlan.py)."""
from __future__ import annotations

from labctl.topology.placement import machine_of

HOST_IMAGE = "labctl/host"


def place(b) -> None:
    """The compile pass: each node's machine, and the container it runs in when the lab file gives
    it none (a switch gets SYS_ADMIN there: its agent loads BPF programs, which Docker 20.10 grants
    with nothing less)."""
    from labctl.plan import model, software
    t = b.topo
    if not t.placement:
        return
    for name, node in b.nodes.items():
        node.machine = machine_of(t, name)
        if node.container is None:
            caps = ["SYS_ADMIN"] if node.switching else []
            node.container = model.Container(software.container_name(t.name, name), HOST_IMAGE, None, {}, [],
                                             cap_add=caps, chosen=True)
