"""Fabrics as the model sees them: GPUs on leaves, leaves on spines and, past two tiers, spines on
cores; every link a capacity, every flow the links the hash model sends it over.

Two ways to get one:
- `Clos.leaf_spine(...)` takes the variables of templates/leaf-spine (and the same formulas for
  which leaf a GPU sits on and how fast an uplink is), so the model of a bundled lab is that lab;
- `Clos.for_gpus(n, radix)` sizes a rail-optimised fat tree for n GPUs from switches of `radix`
  ports: two tiers up to radix²/2 GPUs, three up to radix³/4. A scalable unit is radix/2 servers
  whose GPU g shares leaf g; a pod is radix/2 leaves with radix/2 spines; spine j of every pod
  joins the radix/2 cores of plane j.

Links are numbered so that one `numpy.bincount` gives every link's load in a draw.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from labctl.errors import InputError, LabError, Where
from labctl.estimate import hashing

NO_LINK = -1


def OPTION(name: str) -> Where:
    return Where("labctl estimate", key=name)


@dataclass(frozen=True)
class Clos:
    gpus: int
    gpus_per_server: int
    leaf_of: np.ndarray        # GPU -> leaf
    leaves: int
    spines: int                # per pod; in two tiers, every leaf reaches every spine
    pods: int                  # 1: two tiers
    cores_per_plane: int       # three tiers: spine j of each pod reaches this many cores of plane j
    nic_bps: float             # a GPU's scale-out NIC
    uplink_bps: float          # leaf <-> spine
    core_bps: float            # spine <-> core
    nvlink_bps: float          # a GPU's scale-up port; 0: no scale-up domain

    @classmethod
    def leaf_spine(cls, spines: int, leaves: int, servers: int, gpus_per_server: int, rail_optimised: bool = True,
                   gpu_bps: float = 400e9, nvlink_bps: float = 7200e9, oversubscription: float = 1.0,
                   scale_up: bool = True) -> "Clos":
        """templates/leaf-spine with the same variables (and the same leaf of each GPU)."""
        if rail_optimised and leaves % gpus_per_server:
            raise LabError(f"rail_optimised needs leaves ({leaves}) to be a multiple of gpus_per_server "
                           f"({gpus_per_server})", "change leaves or gpus_per_server")
        groups = leaves // gpus_per_server if rail_optimised else leaves
        s, g = np.divmod(np.arange(servers * gpus_per_server), gpus_per_server)
        leaf = g * groups + s % groups if rail_optimised else s % leaves
        per_group = -(-servers // groups)
        down = per_group if rail_optimised else per_group * gpus_per_server
        uplink = gpu_bps * down / (spines * oversubscription)
        return cls(servers * gpus_per_server, gpus_per_server, leaf, leaves, spines, 1, 0, gpu_bps, uplink, 0.0,
                   nvlink_bps if scale_up else 0.0)

    @classmethod
    def for_gpus(cls, gpus: int, gpus_per_server: int = 8, radix: int = 64, gpu_bps: float = 400e9,
                 nvlink_bps: float = 7200e9) -> "Clos":
        """A non-blocking rail-optimised fat tree for `gpus` GPUs from `radix`-port switches."""
        if radix < 4 or radix % 2:
            raise InputError(OPTION("--radix"), f"{radix}: a switch needs an even number of ports, at least 4",
                             "try --radix 64")
        if gpus % gpus_per_server:
            raise InputError(OPTION("--gpus"), f"{gpus} is not a multiple of --gpus-per-server {gpus_per_server}",
                             "give whole servers")
        half = radix // 2
        if gpus > radix ** 3 // 4:
            raise InputError(OPTION("--gpus"), f"{gpus} GPUs need more than three tiers of {radix}-port switches "
                             f"(at most {radix ** 3 // 4:,})", f"use --radix {2 * radix}")
        s, g = np.divmod(np.arange(gpus), gpus_per_server)
        leaf = (s // half) * gpus_per_server + g          # scalable unit s // half, rail g
        leaves = int(leaf.max()) + 1
        if leaves <= radix:                                # two tiers: a spine has a port for every leaf
            return cls(gpus, gpus_per_server, leaf, leaves, half, 1, 0, gpu_bps, gpu_bps, 0.0, nvlink_bps)
        return cls(gpus, gpus_per_server, leaf, leaves, half, math.ceil(leaves / half), half, gpu_bps, gpu_bps,
                   gpu_bps, nvlink_bps)

    @property
    def tiers(self) -> int:
        return 2 if self.pods == 1 else 3

    @property
    def leaves_per_pod(self) -> int:
        return -(-self.leaves // self.pods)

    # link numbering: NIC tx, NIC rx, NVLink tx, NVLink rx, leaf up, spine down, spine up, core down
    def _offsets(self) -> list[int]:
        g, up = self.gpus, self.leaves * self.spines
        spine_count = self.pods * self.spines
        core = spine_count * self.cores_per_plane
        sizes = [g, g, g, g, up, up, core, core]
        return [int(x) for x in np.cumsum([0] + sizes)]

    def capacities(self) -> np.ndarray:
        o = self._offsets()
        cap = np.empty(o[-1])
        for k, bps in enumerate((self.nic_bps, self.nic_bps, self.nvlink_bps, self.nvlink_bps, self.uplink_bps,
                                 self.uplink_bps, self.core_bps, self.core_bps)):
            cap[o[k]:o[k + 1]] = bps
        return cap

    def tier_of_link(self) -> list[tuple[str, int, int]]:
        """(name, first link id, end) of each kind of link, for reporting loads per tier."""
        names = ["NIC tx", "NIC rx", "NVLink tx", "NVLink rx", "leaf->spine", "spine->leaf", "spine->core",
                 "core->spine"]
        o = self._offsets()
        return [(n, o[k], o[k + 1]) for k, n in enumerate(names) if o[k + 1] > o[k]]

    def paths(self, src: np.ndarray, dst: np.ndarray, qp: np.ndarray, seed: int, seeds: str = "same",
              spine: np.ndarray | None = None, fixed_sport: bool = False) -> np.ndarray:
        """The links of each flow (rows, NO_LINK-padded). A flow inside a server rides NVLink when
        there is a scale-up domain; else its NIC, and the spine the hash picks (or `spine`, the
        choices a lab's kernel made, recorded by the run). `seeds`: "same" on every switch, as in
        the lab, or "per-switch". `fixed_sport`: every flow on UDP source port 0xC000 (the
        workload option `sport: fixed`), so only the addresses vary."""
        o = self._offsets()
        n = len(src)
        out = np.full((n, 6), NO_LINK, dtype=np.int64)
        server_a, server_b = src // self.gpus_per_server, dst // self.gpus_per_server
        nvl = (server_a == server_b) & (self.nvlink_bps > 0)
        out[nvl, 0] = o[2] + src[nvl]
        out[nvl, 1] = o[3] + dst[nvl]
        net = ~nvl
        out[net, 0] = o[0] + src[net]
        out[net, 1] = o[1] + dst[net]
        la, lb = self.leaf_of[src], self.leaf_of[dst]
        fabric = net & (la != lb)
        sport = np.full(n, 0xC000, dtype=np.uint64) if fixed_sport else \
            hashing.udp_sport(hashing.qpn(src, dst, qp), hashing.qpn(dst, src, qp))
        h_leaf = hashing.flow_hash(src, dst, sport, seed, 0 if seeds == "same" else la + 1)
        j = hashing.select(h_leaf, self.spines) if spine is None else np.asarray(spine)
        out[fabric, 2] = o[4] + la[fabric] * self.spines + j[fabric]
        out[fabric, 3] = o[5] + lb[fabric] * self.spines + j[fabric]
        if self.pods > 1:
            pa, pb = la // self.leaves_per_pod, lb // self.leaves_per_pod
            cross = fabric & (pa != pb)
            spine_id = pa * self.spines + j
            h_spine = hashing.flow_hash(src, dst, sport, seed, 0 if seeds == "same" else spine_id + 1 + self.leaves)
            c = hashing.select(h_spine, self.cores_per_plane)
            out[cross, 4] = o[6] + spine_id[cross] * self.cores_per_plane + c[cross]
            out[cross, 5] = o[7] + (pb * self.spines + j)[cross] * self.cores_per_plane + c[cross]
        return out

    def hops(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Store-and-forward hops of each flow: 1 on NVLink or under one leaf, 2 via a spine (NIC-leaf-
        spine-leaf-NIC has four links: three forwarders after the NIC), 4 via a core."""
        same_server = (src // self.gpus_per_server == dst // self.gpus_per_server) & (self.nvlink_bps > 0)
        la, lb = self.leaf_of[src], self.leaf_of[dst]
        h = np.where(la == lb, 2, 4)
        if self.pods > 1:
            pod = self.leaves_per_pod
            h = np.where((la != lb) & (la // pod != lb // pod), 6, h)
        return np.where(same_server, 1, h)
