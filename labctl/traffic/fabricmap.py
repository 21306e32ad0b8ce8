"""Which fabric a link, a path and a transfer's bytes belong to (pure logic on the plan).

Four fabrics are counted: `scaleup` (NVLink), `scaleout` (the RoCE backend), `scaleacross` (the
WAN between zones) and `frontend`. A fabric's bytes are link bytes: the L2 frame bytes (Ethernet,
IPv4, UDP, BTH, RETH/immediate where the packet has them, ICRC; no preamble or FCS, as a veth's
counters see them) summed over the fabric's links, each link counted once in both directions. A
transfer that crosses a leaf-spine's four links counts four times in `scaleout`: that is the load
the fabric carries, what its port counters add up to.

Two GPUs talk over the NIC `path_ports` picks (NVLink inside a scale-up island, else the backend);
from there the bytes follow a shortest path of their routing domain, as the static ECMP routes do.
Equal-cost paths of the bundled fabrics cross the same number of links of each fabric, so one
shortest path gives every fabric's hop count.
"""
from __future__ import annotations

from collections import deque
from functools import lru_cache

from labctl.errors import LabError
from labctl.plan.model import LabPlan, Link, Node
from labctl.plan.routing import routing_domains
from labctl.traffic import roce
from labctl.traffic.pool import path_ports

FABRIC_KEYS = {"scale-up": "scaleup", "scale-out": "scaleout", "scale-across": "scaleacross", "frontend": "frontend"}
FABRICS = tuple(FABRIC_KEYS.values())


def fabric_key(plan: LabPlan, fabric_name: str) -> str:
    """The counted fabric ("scaleup", ...) a plan fabric (by name) belongs to."""
    return FABRIC_KEYS[plan.fabrics[fabric_name].kind]


def link_fabric(plan: LabPlan, link: Link) -> str:
    return fabric_key(plan, link.fabric)


def zeros() -> dict[str, int]:
    return {f: 0 for f in FABRICS}


@lru_cache(maxsize=4096)
def frame_bytes(nbytes: int, netdev_mtu: int) -> int:
    """The L2 frame bytes one RDMA WRITE (with immediate) of `nbytes` puts on every link it crosses."""
    total = 0
    for opcode, payload in roce.message_opcodes(nbytes, roce.roce_mtu(netdev_mtu)):
        total += roce.FRAME_OVERHEAD + payload + (roce.RETH_LEN if opcode in roce.HAS_RETH else 0) \
            + (roce.IMM_LEN if opcode in roce.HAS_IMM else 0)
    return total


_MAPS: dict[int, "FabricMap"] = {}


def for_plan(plan: LabPlan) -> "FabricMap":
    """One map per plan object (bounds are computed per operation, the routes do not change)."""
    m = _MAPS.get(id(plan))
    if m is None or m.plan is not plan:
        _MAPS.clear()
        m = _MAPS[id(plan)] = FabricMap(plan)
    return m


class FabricMap:
    """The plan's links by fabric, the scale-up islands, and each GPU pair's links per fabric."""

    def __init__(self, plan: LabPlan):
        self.plan = plan
        self.nodes = {n.name: n for n in plan.nodes}
        self.adj: dict[str, list[tuple[str, int, str]]] = {}    # node -> (peer, link id, local iface)
        for lk in plan.links:
            (a, ia), (b, ib) = lk.a.split(":", 1), lk.b.split(":", 1)
            self.adj.setdefault(a, []).append((b, lk.id, ia))
            self.adj.setdefault(b, []).append((a, lk.id, ib))
        self.links = {lk.id: lk for lk in plan.links}
        self.domain_of: dict[str, str] = {}
        for key, members in routing_domains(plan.fabrics).items():
            for m in members:
                self.domain_of[m] = key
        self._island: dict[str, str] = {}
        self._paths: dict[tuple[str, str, str], dict[str, int]] = {}

    # scale-up islands: the GPUs whose NVLink ports reach one another through NVLink switches
    def island(self, node: Node) -> str | None:
        """The scale-up island of a GPU (the name of the lowest NVLink switch it reaches), or None."""
        if node.name in self._island:
            return self._island[node.name]
        starts = [i.peer_node for i in node.interfaces if self._kind(i.fabric) == "scale-up"
                  and self.nodes[i.peer_node].switching]
        if not starts:
            return None
        seen, todo = set(starts), deque(starts)
        while todo:
            n = todo.popleft()
            for peer, lid, _ in self.adj.get(n, []):
                if peer not in seen and self.nodes[peer].switching and \
                        self._kind(self.links[lid].fabric) == "scale-up":
                    seen.add(peer)
                    todo.append(peer)
        name = min(seen)
        for n in seen:
            for peer, lid, _ in self.adj.get(n, []):
                if not self.nodes[peer].switching:
                    self._island[peer] = name
        return self._island.get(node.name, name)

    def _kind(self, fabric: str) -> str:
        return self.plan.fabrics[fabric].kind

    def hops(self, a: Node, b: Node) -> dict[str, int]:
        """Links of each fabric between two GPUs on the route their traffic takes."""
        ia, _ib = path_ports(self.plan, a, b)
        key = (a.name, ia.name, b.name)
        if key not in self._paths:
            self._paths[key] = self._route(a, ia, b)
        return self._paths[key]

    def _route(self, a: Node, ia, b: Node) -> dict[str, int]:
        """Shortest path from port `ia` of `a` to `b` through forwarding nodes of ia's routing domain."""
        domain = self.domain_of.get(ia.fabric, ia.fabric)
        allowed = {f for f, d in self.domain_of.items() if d == domain} | {ia.fabric}
        first = ia.peer_node
        parent: dict[str, tuple[str, int]] = {first: (a.name, ia.link)}
        todo = deque([first])
        while todo and b.name not in parent:
            n = todo.popleft()
            if not self.nodes[n].switching:
                continue
            for peer, lid, _ in self.adj.get(n, []):
                if peer in parent or peer == a.name or self.links[lid].fabric not in allowed:
                    continue
                parent[peer] = (n, lid)
                todo.append(peer)
        if b.name not in parent:
            # labctl follows a path only through the nodes it knows forward (switches, routers it
            # routes): a containerlab file's FRR routers, or nodes that route by their own exec lines,
            # are end hosts to it unless their labels say otherwise
            hosts = sorted({n for n in parent if n != a.name and not self.nodes[n].switching})
            raise LabError(f"no path labctl can follow from {a.name}:{ia.name} to {b.name}: "
                           f"{', '.join(hosts[:4]) or ia.peer_node} {'is' if len(hosts) == 1 else 'are'} not a switch "
                           "or router to labctl", "if they forward (FRR, or routes set by exec: lines), label them "
                           "`labels: {labctl.kind: switch}` in the containerlab file (docs/containerlab.md)")
        out, delay = zeros(), 0
        n = b.name
        while n != a.name:
            prev, lid = parent[n]
            out[link_fabric(self.plan, self.links[lid])] += 1
            delay += self.links[lid].lab_delay_ns
            n = prev
        self._last_delay = delay / 1e9
        return out

    def delay_s(self, a: Node, b: Node) -> float:
        """Lab one-way propagation delay between two GPUs: the delays of the links on their route."""
        ia, _ = path_ports(self.plan, a, b)
        key = ("delay", a.name, ia.name, b.name)
        if key not in self._paths:
            self._route(a, ia, b)
            self._paths[key] = self._last_delay
        return self._paths[key]

    def expected(self, transfers, nodes: dict[int, Node]) -> dict[str, int]:
        """The frame bytes each fabric's links carry for these transfers (Transfer.src/dst are ranks)."""
        out = zeros()
        for t in transfers:
            a, b = nodes[t.src], nodes[t.dst]
            ia, _ = path_ports(self.plan, a, b)
            frames = frame_bytes(t.nbytes, ia.mtu)
            for f, n in self.hops(a, b).items():
                out[f] += n * frames
        return out

    def port_fabrics(self) -> dict[tuple[str, str], str]:
        """(node, iface) -> fabric key, for every port of every link."""
        out = {}
        for lk in self.plan.links:
            f = link_fabric(self.plan, lk)
            for end in (lk.a, lk.b):
                node, iface = end.split(":", 1)
                out[(node, iface)] = f
        return out


def compare(measured: dict[str, int], expected: dict[str, int], tolerance: float = 0.02) -> dict[str, dict]:
    """Per fabric: measured, expected, their ratio and whether they agree within `tolerance`
    (a fabric expected to carry nothing agrees when it carried under 1% of the run's total)."""
    total = max(1, sum(measured.values()))
    out = {}
    for f in FABRICS:
        m, e = measured.get(f, 0), expected.get(f, 0)
        ok = abs(m - e) <= tolerance * e if e else m <= 0.01 * total
        out[f] = {"measured": m, "expected": e, "ratio": m / e if e else None, "agrees": ok}
    return out


def measured(plan: LabPlan, before: dict[int, int], after: dict[int, int]) -> dict[str, int]:
    """Per fabric: bytes its links carried between two snapshots."""
    out = zeros()
    by_id = {lk.id: lk for lk in plan.links}
    for lid, value in after.items():
        out[link_fabric(plan, by_id[lid])] += value - before.get(lid, 0)
    return out


def table(doc: dict) -> list[str]:
    """The run summary's lines: per fabric, measured and expected bytes and their ratio."""
    fb, exp = doc.get("fabric_bytes"), doc.get("fabric_bytes_expected")
    if not fb:
        return []
    lines = [f"# {'fabric':<12} {'measured (B)':>16} {'expected (B)':>16} {'ratio':>7}   (L2 frame bytes summed "
             f"over the fabric's links)"]
    for f in FABRICS:
        m, e = fb.get(f, 0), (exp or {}).get(f, 0)
        ratio = f"{m / e:7.4f}" if e else ("      -" if not m else "   n/a")
        lines.append(f"# {f:<12} {m:>16,} {e:>16,} {ratio}")
    note = doc.get("fabric_bytes_note")
    if note:
        lines.append("# " + note)
    return lines
