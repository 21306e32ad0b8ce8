"""Which fabric a rank pair's traffic crosses, and the bytes a schedule puts on each (pure logic).

A transfer counts once, on the outermost fabric its path crosses: NVLink (scaleup) when the two
GPUs share a scale-up domain, the frontend when that is the fabric they share, the WAN
(scaleacross) when their zones differ, else the backend (scaleout). Wire bytes add each packet's
headers (Ethernet, IPv4, UDP, BTH, ICRC and the RETH of a message's first packet) to the payload,
which is what a port counter sees.
"""
from __future__ import annotations

from labctl.kinds import fabric_kind
from labctl.plan.model import LabPlan, Node
from labctl.traffic import roce
from labctl.traffic.pool import path_ports

FABRICS = ("scaleup", "scaleout", "scaleacross", "frontend")
_BY_KIND = {"scale-up": "scaleup", "scale-out": "scaleout", "scale-across": "scaleacross", "frontend": "frontend"}


def present(plan: LabPlan) -> list[str]:
    """The fabrics this lab has (scale-across when its GPUs span zones)."""
    kinds = {_BY_KIND.get(fabric_kind(f.kind).name, "scaleout") for f in plan.fabrics.values()}
    if len({n.zone for n in plan.nodes if n.rank is not None}) > 1:
        kinds.add("scaleacross")
    return [f for f in FABRICS if f in kinds]


def pair_fabric(plan: LabPlan, a: Node, b: Node) -> str:
    ia, _ = path_ports(plan, a, b)
    kind = _BY_KIND.get(fabric_kind(plan.fabrics[ia.fabric].kind).name, "scaleout")
    if kind == "scaleout" and a.zone != b.zone:
        return "scaleacross"
    return kind


def wire_bytes(payload: int, mtu: int) -> int:
    """What a port counts for one RDMA WRITE message of `payload` bytes."""
    seg = roce.roce_mtu(mtu)
    packets = max(1, -(-payload // seg))
    return payload + packets * roce.FRAME_OVERHEAD + roce.RETH_LEN + roce.IMM_LEN


def expected(plan: LabPlan, nodes: dict[int, Node], transfers, wire: bool = False) -> dict[str, int]:
    """Bytes per fabric (payload, or on the wire) of `transfers`, each on its outermost fabric."""
    out = dict.fromkeys(FABRICS, 0)
    cache: dict[tuple[int, int], tuple[str, int]] = {}
    for t in transfers:
        key = (t.src, t.dst)
        if key not in cache:
            a, b = nodes[t.src], nodes[t.dst]
            cache[key] = (pair_fabric(plan, a, b), path_ports(plan, a, b)[0].mtu)
        fabric, mtu = cache[key]
        out[fabric] += wire_bytes(t.nbytes, mtu) if wire else t.nbytes
    return out
