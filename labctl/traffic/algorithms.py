"""Collective algorithms beside the ring: NCCL's double binary tree, and the choice `auto` makes.

Double binary tree (NCCL's ncclGetDtree, src/graph/trees.cc): tree 0 is a binary tree over rank
positions 0..n-1 in which a position's parent comes from its lowest set bit; tree 1 is tree 0
mirrored (n even: position p becomes n-1-p) or shifted by one (n odd), so that a rank that is
interior in one tree is a leaf in the other. Each tree carries half the buffer: a reduce toward
its root, then a broadcast from it, both pipelined slice by slice. Per tree a non-root rank sends
its half once to its parent and once to each child: rank r sends S/2 x (up_t(r) + children_t(r))
summed over both trees, 2(n-1)/n x S on average, as a ring.

`auto` (all-reduce) plays what NCCL's tuner would: NCCL models each algorithm's time as latency plus
size over bandwidth on the detected topology and picks the fastest. labctl does the same with its
α-β bound on this lab's paths: `hier` when the ranks span more than one NVLink island holding
several of them (NCCL builds its rings and trees NVLink first), else the lower bound of ring and
tree at this size (trees win small messages where α is large: 2 log2 n latencies instead of 2(n-1);
with α = 0 a pipelined tree's fill and drain can cost it more than a ring).
"""
from __future__ import annotations

import itertools

from labctl.plan.model import LabPlan
from labctl.traffic.schedule import DEFAULT_SLICE, Schedule, Transfer, hierarchical_all_reduce, \
    ring_all_reduce, slices, split

ALGORITHMS = ("ring", "tree", "hier", "auto")


def btree_parent(p: int, n: int) -> int:
    """The parent position of position p in NCCL's binary tree over n positions (-1: the root)."""
    if p == 0:
        return -1
    bit = p & -p
    up = (p ^ bit) | (bit << 1)
    return up if up < n else p ^ bit


def dtree_parents(n: int) -> list[list[int]]:
    """Each tree's parent position per position: tree 0 and its mirror (n even) or shift (n odd)."""
    t0 = [btree_parent(p, n) for p in range(n)]
    if n % 2 == 0:
        t1 = [-1 if t0[n - 1 - p] < 0 else n - 1 - t0[n - 1 - p] for p in range(n)]
    else:
        t1 = [-1 if t0[(p - 1) % n] < 0 else (t0[(p - 1) % n] + 1) % n for p in range(n)]
    return [t0, t1]


def depths(parent: list[int]) -> list[int]:
    out = []
    for p in range(len(parent)):
        d, q = 0, p
        while parent[q] >= 0:
            q, d = parent[q], d + 1
        out.append(d)
    return out


def tree_all_reduce(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    """All-reduce over NCCL's double binary tree: per tree half the buffer, reduce up then broadcast down."""
    ids = ids or itertools.count()
    n = len(ranks)
    out: list[Transfer] = []
    for tree, (parent, half) in enumerate(zip(dtree_parents(n), split(size, 2))):
        children = {p: [c for c in range(n) if parent[c] == p] for p in range(n)}
        depth = depths(parent)
        top = max(depth)
        pieces = slices(half, slice_bytes)
        up: dict[tuple[int, int], int] = {}       # (child position, slice) -> id of its send to the parent
        for p in sorted(range(n), key=lambda q: -depth[q]):       # leaves first
            if parent[p] < 0:
                continue
            for k, s in enumerate(pieces):
                after = tuple(up[(c, k)] for c in children[p])
                t = Transfer(next(ids), ranks[p], ranks[parent[p]], s, after, "tree_reduce", top - depth[p], tree)
                out.append(t)
                up[(p, k)] = t.id
        down: dict[tuple[int, int], int] = {}     # (position, slice) -> id that brought the result there
        root = parent.index(-1)
        for p in sorted(range(n), key=lambda q: depth[q]):        # root first
            for k, s in enumerate(pieces):
                after = tuple(up[(c, k)] for c in children[p]) if p == root else (down[(p, k)],)
                for c in children[p]:
                    t = Transfer(next(ids), ranks[p], ranks[c], s, after, "tree_broadcast", top + depth[p], tree)
                    out.append(t)
                    down[(c, k)] = t.id
    return Schedule("all_reduce", list(ranks), size, out)


def tree_bytes_per_rank(n: int, size: int) -> list[int]:
    """The formula: position p sends each tree's half once up (unless it is that tree's root) and
    once to each of its children."""
    out = [0] * n
    for parent, half in zip(dtree_parents(n), split(size, 2)):
        for p in range(n):
            out[p] += half * ((parent[p] >= 0) + sum(1 for c in range(n) if parent[c] == p))
    return out


def islands(plan: LabPlan, ranks: list[int], nvlink_only: bool = False) -> list[list[int]]:
    """The ranks grouped by NVLink island (a server, or a rack's NVL72), in order; without NVLink
    by server, unless `nvlink_only` (then each such rank is alone)."""
    from labctl.traffic.fabricmap import FabricMap
    from labctl.traffic.pool import gpu_ranks
    fm, nodes = FabricMap(plan), gpu_ranks(plan)
    groups: dict[str, list[int]] = {}
    for r in ranks:
        fallback = nodes[r].name if nvlink_only else (nodes[r].server or nodes[r].name)
        groups.setdefault(fm.island(nodes[r]) or fallback, []).append(r)
    return list(groups.values())


def choose(plan: LabPlan, ranks: list[int], size: int, slice_bytes: int, channels: int, alpha_ns: float) -> str:
    """`auto`'s pick for an all-reduce (the rule in this module's docstring)."""
    from labctl.traffic.bound import ideal_seconds
    from labctl.traffic.pool import gpu_ranks
    groups = islands(plan, ranks, nvlink_only=True)
    if len(groups) > 1 and min(len(g) for g in groups) > 1 and len({len(g) for g in groups}) == 1:
        return "hier"
    nodes, alpha = gpu_ranks(plan), alpha_ns * 1e-9 * plan.dilation
    ring = ideal_seconds(plan, ring_all_reduce(ranks, size, slice_bytes, channels), nodes, alpha)
    tree = ideal_seconds(plan, tree_all_reduce(ranks, size, slice_bytes, channels), nodes, alpha)
    return "tree" if tree < ring else "ring"


def schedule(plan: LabPlan, collective: str, algorithm: str, ranks: list[int], size: int,
             slice_bytes: int = DEFAULT_SLICE, channels: int = 1, alpha_ns: float = 0.0) -> Schedule:
    """An all-reduce (or hier_all_reduce) by the named algorithm."""
    if collective == "hier_all_reduce":
        algorithm = "hier"
    if algorithm == "auto":
        algorithm = choose(plan, ranks, size, slice_bytes, channels, alpha_ns)
    if algorithm == "hier":
        s = hierarchical_all_reduce(islands(plan, ranks), size, slice_bytes, channels)
    elif algorithm == "tree":
        s = tree_all_reduce(ranks, size, slice_bytes, channels)
    else:
        s = ring_all_reduce(ranks, size, slice_bytes, channels)
    s.algorithm = algorithm
    return s
