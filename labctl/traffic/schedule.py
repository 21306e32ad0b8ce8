"""Collectives as schedules of transfers with data dependencies (pure logic, unit-tested).

A transfer is one RDMA WRITE message from one rank to another. It may start only when every
transfer in its `after` list has arrived at its sender: in a ring, step s+1 of a slice leaves a
rank only once step s of that slice has arrived there, so the slowest link sets the pace. Chunks
are cut into slices (NCCL's Simple protocol steps, default 512 KiB) that pipeline through the ring.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

DEFAULT_SLICE = 512 * 1024
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "sendrecv", "incast",
               "hier_all_reduce")


@dataclass(frozen=True)
class Transfer:
    id: int
    src: int
    dst: int
    nbytes: int
    after: tuple[int, ...]
    phase: str
    step: int
    channel: int = 0
    delay: float = 0.0       # seconds the sender computes, once its `after` have arrived, before sending


@dataclass
class Schedule:
    collective: str
    ranks: list[int]
    size: int                      # nccl-tests' size: the whole buffer (per rank for all_to_all)
    transfers: list[Transfer] = field(default_factory=list)
    algorithm: str = "ring"        # all-reduce: ring, tree or hier (traffic/algorithms.py)

    def bytes_sent(self) -> dict[int, int]:
        out = {r: 0 for r in self.ranks}
        for t in self.transfers:
            out[t.src] += t.nbytes
        return out

    def bytes_received(self) -> dict[int, int]:
        out = {r: 0 for r in self.ranks}
        for t in self.transfers:
            out[t.dst] += t.nbytes
        return out

    def steps(self, phase: str | None = None) -> int:
        steps = {t.step for t in self.transfers if phase is None or t.phase == phase}
        return len(steps)


def split(total: int, parts: int) -> list[int]:
    """`total` bytes in `parts` near-equal pieces (the first ones one byte larger), none empty."""
    parts = max(1, min(parts, total)) if total else 1
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def slices(nbytes: int, slice_bytes: int) -> list[int]:
    return split(nbytes, -(-nbytes // slice_bytes)) if nbytes else []


def _ring_pass(ids, ring: list[int], chunk: int, nsteps: int, phase: str, slice_bytes: int, channels: int,
               first_deps: dict | None = None) -> tuple[list[Transfer], dict]:
    """`nsteps` steps around `ring`, each rank sending `chunk` bytes per step to its successor.

    Returns the transfers and, keyed by (receiving position, channel, slice), the id that arrives
    there in the last step (what a following pass depends on).
    """
    n = len(ring)
    shape = [(ch, k, size) for ch, per in enumerate(split(chunk, channels)) for k, size in enumerate(
        slices(per, slice_bytes))]
    out: list[Transfer] = []
    prev: dict = dict(first_deps or {})
    for s in range(nsteps):
        cur = {}
        for pos in range(n):
            for ch, k, size in shape:
                dep = prev.get((pos, ch, k))
                after = dep if isinstance(dep, tuple) else ((dep,) if dep is not None else ())
                t = Transfer(next(ids), ring[pos], ring[(pos + 1) % n], size, after, phase, s, ch)
                out.append(t)
                cur[((pos + 1) % n, ch, k)] = t.id
        prev = cur
    return out, prev


def ring_reduce_scatter(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    ids = ids or itertools.count()
    n = len(ranks)
    ts, _ = _ring_pass(ids, ranks, size // n, n - 1, "reduce_scatter", slice_bytes, channels)
    return Schedule("reduce_scatter", list(ranks), size, ts)


def ring_all_gather(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    ids = ids or itertools.count()
    n = len(ranks)
    ts, _ = _ring_pass(ids, ranks, size // n, n - 1, "all_gather", slice_bytes, channels)
    return Schedule("all_gather", list(ranks), size, ts)


def ring_all_reduce(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    """Reduce-scatter then all-gather; a slice's all-gather starts where its reduction completed."""
    ids = ids or itertools.count()
    n = len(ranks)
    rs, last = _ring_pass(ids, ranks, size // n, n - 1, "reduce_scatter", slice_bytes, channels)
    ag, _ = _ring_pass(ids, ranks, size // n, n - 1, "all_gather", slice_bytes, channels, first_deps=last)
    ag = [Transfer(t.id, t.src, t.dst, t.nbytes, t.after, t.phase, t.step + n - 1, t.channel) for t in ag]
    return Schedule("all_reduce", list(ranks), size, rs + ag)


def all_to_all(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    """Every rank sends size/n to every other rank; rank i starts with i+1 to spread the load."""
    ids = ids or itertools.count()
    n = len(ranks)
    out = []
    for i, src in enumerate(ranks):
        for d in range(1, n):
            dst = ranks[(i + d) % n]
            out += [Transfer(next(ids), src, dst, s, (), "all_to_all", 0, 0) for s in slices(size // n, slice_bytes)]
    return Schedule("all_to_all", list(ranks), size, out)


def broadcast(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    """Pipelined ring broadcast from ranks[0]: each rank forwards a slice once it has it."""
    ids = ids or itertools.count()
    out = []
    prev: dict[int, int] = {}
    for hop in range(len(ranks) - 1):
        cur = {}
        for k, s in enumerate(slices(size, slice_bytes)):
            after = (prev[k],) if k in prev else ()
            t = Transfer(next(ids), ranks[hop], ranks[hop + 1], s, after, "broadcast", hop, 0)
            out.append(t)
            cur[k] = t.id
        prev = cur
    return Schedule("broadcast", list(ranks), size, out)


def sendrecv(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    ids = ids or itertools.count()
    src, dst = ranks[0], ranks[1]
    return Schedule("sendrecv", [src, dst], size,
                    [Transfer(next(ids), src, dst, s, (), "sendrecv", 0) for s in slices(size, slice_bytes)])


def incast(ranks, size, slice_bytes=DEFAULT_SLICE, channels=1, ids=None) -> Schedule:
    """N:1 — every rank but ranks[0] sends `size` bytes to ranks[0] at once."""
    ids = ids or itertools.count()
    dst = ranks[0]
    out = []
    for k, s in enumerate(slices(size, slice_bytes)):
        out += [Transfer(next(ids), src, dst, s, (), "incast", 0) for src in ranks[1:]]
    return Schedule("incast", list(ranks), size, out)


def hierarchical_all_reduce(groups: list[list[int]], size, slice_bytes=DEFAULT_SLICE, channels=1,
                            ids=None) -> Schedule:
    """Reduce-scatter inside each server (scale-up), all-reduce each shard across servers along its
    rail, all-gather inside each server. `groups` lists each server's ranks in local order."""
    ids = ids or itertools.count()
    g = len(groups[0])
    if any(len(x) != g for x in groups):
        raise ValueError("every server needs the same number of GPUs for a hierarchical all-reduce")
    out: list[Transfer] = []
    done: dict[int, tuple[int, ...]] = {}   # rank -> ids that must have arrived before its next phase

    def arrivals(ts):
        got: dict[int, list[int]] = {}
        for t in ts:
            got.setdefault(t.dst, []).append(t.id)
        return {r: tuple(v) for r, v in got.items()}

    def gate(ts, deps):
        return [Transfer(t.id, t.src, t.dst, t.nbytes, t.after or deps.get(t.src, ()), t.phase, t.step, t.channel)
                if t.step == 0 else t for t in ts]

    phase1 = []
    for grp in groups:
        phase1 += ring_reduce_scatter(grp, size, slice_bytes, channels, ids).transfers if g > 1 else []
    out += [Transfer(t.id, t.src, t.dst, t.nbytes, t.after, "intra_reduce_scatter", t.step, t.channel) for t in phase1]
    done = arrivals(phase1)
    phase2 = []
    if len(groups) > 1:
        for i in range(g):
            rail = [grp[i] for grp in groups]
            phase2 += gate(ring_all_reduce(rail, size // g, slice_bytes, channels, ids).transfers, done)
    out += [Transfer(t.id, t.src, t.dst, t.nbytes, t.after, "inter_all_reduce", t.step + g, t.channel)
            for t in phase2]
    done = {**done, **arrivals(phase2)} if phase2 else done
    phase3 = []
    for grp in groups:
        phase3 += gate(ring_all_gather(grp, size, slice_bytes, channels, ids).transfers, done) if g > 1 else []
    offset = g + 2 * len(groups)
    out += [Transfer(t.id, t.src, t.dst, t.nbytes, t.after, "intra_all_gather", t.step + offset, t.channel)
            for t in phase3]
    return Schedule("hier_all_reduce", [r for grp in groups for r in grp], size, out)


GENERATORS = {
    "all_reduce": ring_all_reduce,
    "reduce_scatter": ring_reduce_scatter,
    "all_gather": ring_all_gather,
    "all_to_all": all_to_all,
    "broadcast": broadcast,
    "sendrecv": sendrecv,
    "incast": incast,
}


def bus_factor(collective: str, n: int) -> float:
    """busbw = algbw × this (nccl-tests' PERFORMANCE.md)."""
    if collective in ("all_reduce", "hier_all_reduce"):
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def ideal_seconds(collective: str, n: int, size: int, bytes_per_s: float, alpha: float = 0.0) -> float:
    """The α-β bound: ring RS/AG (n−1)α + (n−1)/n·S/B, all-reduce twice that; others by bytes sent."""
    if collective in ("reduce_scatter", "all_gather"):
        return (n - 1) * alpha + (n - 1) / n * size / bytes_per_s
    if collective in ("all_reduce", "hier_all_reduce"):
        return 2 * ((n - 1) * alpha + (n - 1) / n * size / bytes_per_s)
    if collective == "all_to_all":
        return alpha + (n - 1) / n * size / bytes_per_s
    if collective == "broadcast":
        return (n - 1) * alpha + size / bytes_per_s
    if collective == "incast":
        return alpha + (n - 1) * size / bytes_per_s   # the receiver's link carries everything
    return alpha + size / bytes_per_s
