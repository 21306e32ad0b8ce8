"""Collectives as phases of concurrent ring hops: the shape the α-β model and the ECMP draw need.

A phase is a set of hops (src -> dst) that all send `chunk` bytes per step for `steps` steps. Ring
RS and AG are one phase of n-1 steps of S/n; a ring all-reduce is 2(n-1) such steps (the same
hops); a hierarchical all-reduce is a reduce-scatter inside every server, an all-reduce of S/g per
rail across servers, and an all-gather inside every server (labctl.traffic.schedule builds the
same collectives as transfers for the agents; this is their shape at any size).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labctl.errors import LabError

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "hier_all_reduce")


@dataclass(frozen=True)
class Phase:
    name: str
    src: np.ndarray
    dst: np.ndarray
    steps: int
    chunk: float           # bytes each hop sends per step


def ring(order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.asarray(order, dtype=np.int64)
    return order, np.roll(order, -1)


def phases(collective: str, order: np.ndarray, size: float, gpus_per_server: int) -> list[Phase]:
    """`order`: the ranks' GPUs in ring order (for hier_all_reduce, server-major, whole servers)."""
    n = len(order)
    if n < 2:
        raise LabError(f"a collective needs at least 2 ranks, got {n}", "give more ranks")
    if collective in ("reduce_scatter", "all_gather"):
        return [Phase(collective, *ring(order), n - 1, size / n)]
    if collective == "all_reduce":
        return [Phase(collective, *ring(order), 2 * (n - 1), size / n)]
    if collective == "hier_all_reduce":
        g = gpus_per_server
        if n % g:
            raise LabError(f"hier_all_reduce needs whole servers: {n} ranks is not a multiple of {g} GPUs per "
                           "server", "give whole servers")
        servers = np.asarray(order).reshape(-1, g)
        out = []
        if g > 1:
            intra = [ring(s) for s in servers]
            src, dst = np.concatenate([a for a, _ in intra]), np.concatenate([b for _, b in intra])
            out.append(Phase("intra_reduce_scatter", src, dst, g - 1, size / g))
        if len(servers) > 1:
            rails = [ring(servers[:, i]) for i in range(g)]
            src, dst = np.concatenate([a for a, _ in rails]), np.concatenate([b for _, b in rails])
            out.append(Phase("inter_all_reduce", src, dst, 2 * (len(servers) - 1), size / g / len(servers)))
        if g > 1:
            out.append(Phase("intra_all_gather", out[0].src, out[0].dst, g - 1, size / g))
        return out
    raise LabError(f"collective {collective!r} is not modelled", f"choose one of {', '.join(COLLECTIVES)}")
