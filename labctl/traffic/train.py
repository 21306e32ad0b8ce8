"""One Megatron-style training step as one schedule of transfers with compute gaps (pure logic).

Per micro-batch and layer, forward: attention, then the MLP (or, on a MoE layer, a dispatch
all-to-all, the experts and a combine all-to-all); each block ends in a tensor-parallel all-reduce
of b*s*h bytes (with sequence parallelism an all-gather before it and a reduce-scatter after,
the same bytes). Backward mirrors it: two more all-reduces per layer, the all-to-alls again.
Between stages 1F1B sends each micro-batch's activations forward and their gradients back; every
tp rank sends its 1/tp of them, so a boundary carries b*s*h per micro-batch and direction. Without
sequence parallelism the receiving stage then all-gathers them over its tp group (Megatron-LM's
scatter-gather); with it the 1/tp is the rank's own sequence shard, and no all-gather follows.
After the last backward the data-parallel ranks reduce-scatter the gradients of their stage's
shard, all-reduce it across replicas (HSDP, when dp_shard < dp) and all-gather the updated
parameters (ZeRO / the distributed optimizer). Expert weights do the same over the dp/ep ranks
that hold the same experts.

A rank computes for a block's FLOPs (2 x params x tokens forward, twice that backward, split over
tp) at peak x MFU; the lab plays that time scaled by dilation x size scale, the same factors the
bytes and the rates get, so the ratio of compute to communication is the real one. A compute gap
is carried by the rank's next transfer (`Transfer.delay`), so the traffic comes in bursts.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from labctl.traffic import schedule as sch
from labctl.traffic.schedule import Transfer
from labctl.traffic.train_model import Degrees, Transformer, coordinates, rank_loads, skew_weights


@dataclass(frozen=True)
class TrainStep:
    model: Transformer
    degrees: Degrees
    placement: tuple[str, ...] = ("tp", "pp", "dp")
    micro_batches: int = 4
    micro_batch_size: int = 1
    seq_len: int = 4096
    sequence_parallel: bool = False
    skew: object = "uniform"
    dp_shard: int | None = None       # HSDP: shard over this many dp ranks, replicate across the rest
    scale: float = 1e-3
    peak_flops: float = 989e12        # H100 SXM dense bf16
    mfu: float = 0.4
    time_factor: float = 1.0          # lab seconds per real second of compute: dilation x scale

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.seq_len

    @property
    def activation_bytes(self) -> int:
        """b*s*h in the model's dtype: a tp all-reduce's buffer and a pp boundary's micro-batch."""
        return self.tokens * self.model.hidden * self.model.dtype_bytes

    def compute_s(self, params: int, backward: bool = False) -> float:
        flops = 2 * params * self.tokens / self.degrees.tp * (2 if backward else 1)
        return flops / (self.peak_flops * self.mfu) * self.time_factor


def _sized(nbytes: float, n: int) -> int:
    """`nbytes` rounded down to a multiple of the group size, at least one byte per member."""
    return max(n, int(nbytes) // n * n)


class StepBuilder:
    """Appends collectives in each rank's program order, gating each rank's first send on what it
    last received (the data it needs) and on its pending compute."""

    def __init__(self, cfg: TrainStep, ranks: list[int], slice_bytes: int = sch.DEFAULT_SLICE):
        self.cfg, self.ranks, self.slice = cfg, ranks, slice_bytes
        self.ids = itertools.count()
        self.transfers: list[Transfer] = []
        self.deps: dict[int, list[int]] = {r: [] for r in ranks}
        self.delay: dict[int, float] = {r: 0.0 for r in ranks}
        self.compute_total: dict[int, float] = {r: 0.0 for r in ranks}

    def compute(self, ranks, seconds: float) -> None:
        for r in ranks:
            self.delay[r] += seconds
            self.compute_total[r] += seconds

    def add(self, ts: list[Transfer], dim: str, receivers_wait: bool = True) -> None:
        """Append `ts`; with receivers_wait its receivers' next sends wait for it (a pipeline receiver
        instead starts waiting at its own program point: build_step's `receive`)."""
        gated: set[int] = set()
        out = []
        for t in ts:
            t = dataclasses.replace(t, phase=dim)
            if not t.after:
                first = t.src not in gated
                t = dataclasses.replace(t, after=tuple(self.deps[t.src]),
                                        delay=self.delay[t.src] if first else 0.0)
                gated.add(t.src)
            out.append(t)
        for r in gated:
            self.deps[r], self.delay[r] = [], 0.0
        self.transfers += out
        if not receivers_wait:
            return
        arrived: dict[int, list[int]] = {}
        for t in out:
            arrived.setdefault(t.dst, []).append(t.id)
        for r, got in arrived.items():
            self.deps[r] = self.deps[r] + got

    def collective(self, kind: str, groups, size: int, dim: str) -> None:
        ts = []
        for g in groups:
            if len(g) > 1:
                ts += sch.GENERATORS[kind](list(g), _sized(size, len(g)), self.slice, 1, self.ids).transfers
        self.add(ts, dim)

    def all_to_all(self, groups, per_dst: list[float], dim: str, reverse: bool = False) -> None:
        """Each member sends per_dst[j] bytes to member j (reverse: receives them back, the combine)."""
        ts = []
        for g in groups:
            n = len(g)
            for i, src in enumerate(g):
                # NCCL posts a rank's sends to every peer at once: slices go to the peers in turn
                per_peer = [[(g[(i + d) % n], s) for s in sch.slices(
                    int(per_dst[i] if reverse else per_dst[(i + d) % n]), self.slice)] for d in range(1, n)]
                for k in range(max((len(p) for p in per_peer), default=0)):
                    ts += [Transfer(next(self.ids), src, p[k][0], p[k][1], (), dim, 0) for p in per_peer if k < len(p)]
        self.add(ts, dim)


def build_step(cfg: TrainStep, ranks: list[int], slice_bytes: int = sch.DEFAULT_SLICE) -> StepBuilder:
    """The whole step's transfers; ranks[i] plays participant index i of `coordinates`."""
    d, m = cfg.degrees, cfg.model
    coords = coordinates(len(ranks), d, cfg.placement)
    at = {(c["tp"], c["pp"], c["dp"]): ranks[i] for i, c in enumerate(coords)}
    b = StepBuilder(cfg, ranks, slice_bytes)
    stage_ranks = {s: [at[(t, s, x)] for x in range(d.dp) for t in range(d.tp)] for s in range(d.pp)}
    tp_groups = {s: [[at[(t, s, x)] for t in range(d.tp)] for x in range(d.dp)] for s in range(d.pp)}
    ep_groups = {s: [[at[(t, s, x)] for x in range(e * d.ep, (e + 1) * d.ep)]
                     for t in range(d.tp) for e in range(d.dp // d.ep)] for s in range(d.pp)}
    act = cfg.activation_bytes * cfg.scale
    loads = rank_loads(skew_weights(cfg.skew, m.experts), d.ep) if m.moe and d.ep > 1 else []
    dispatch = [act / d.tp * m.top_k * q for q in loads]
    layers = m.layers // d.pp
    attn_s, mlp_s = m.attention_params, m.top_k * m.expert_params

    # point-to-point transfers are made up front, so a receiver can depend on them before the
    # sender's program reaches them; each is added to the schedule at its sender's point
    def p2p(kind: str, s: int, mb: int) -> dict[int, list[Transfer]]:
        peer = s + 1 if kind == "act" else s - 1
        out = {}
        for x in range(d.dp):
            for t in range(d.tp):
                src, dst = at[(t, s, x)], at[(t, peer, x)]
                out[src] = [Transfer(next(b.ids), src, dst, n, (), "pp", 0)
                            for n in sch.slices(_sized(act / d.tp, 1), slice_bytes)]
        return out

    acts = {(s, i): p2p("act", s, i) for s in range(d.pp - 1) for i in range(cfg.micro_batches)}
    grads = {(s, i): p2p("grad", s, i) for s in range(1, d.pp) for i in range(cfg.micro_batches)}

    def receive(s: int, sent: dict[int, list[Transfer]]) -> None:
        for ts in sent.values():
            for t in ts:
                b.deps[t.dst].append(t.id)
        if not cfg.sequence_parallel:        # the received 1/tp shares made whole again
            b.collective("all_gather", tp_groups[s], int(act), "tp")

    def tp_block(s: int, seconds: float) -> None:
        if cfg.sequence_parallel:
            b.collective("all_gather", tp_groups[s], int(act), "tp")
            b.compute(stage_ranks[s], seconds)
            b.collective("reduce_scatter", tp_groups[s], int(act), "tp")
        else:
            b.compute(stage_ranks[s], seconds)
            b.collective("all_reduce", tp_groups[s], int(act), "tp")

    def moe_block(s: int, seconds: float) -> None:
        b.all_to_all(ep_groups[s], dispatch, "ep")
        b.compute(stage_ranks[s], seconds)
        b.all_to_all(ep_groups[s], dispatch, "ep", reverse=True)
        if d.tp > 1:
            b.collective("all_reduce", tp_groups[s], int(act), "tp")

    def forward(s: int, i: int) -> None:
        if s > 0:
            receive(s, acts[(s - 1, i)])
        for _ in range(layers):
            tp_block(s, cfg.compute_s(attn_s))
            if loads:
                moe_block(s, cfg.compute_s(mlp_s))
            else:
                tp_block(s, cfg.compute_s(mlp_s))
        if s < d.pp - 1:
            b.add([t for ts in acts[(s, i)].values() for t in ts], "pp", receivers_wait=False)

    def backward(s: int, i: int) -> None:
        if s < d.pp - 1:
            receive(s, grads[(s + 1, i)])
        for _ in range(layers):
            if loads:
                moe_block(s, cfg.compute_s(mlp_s, backward=True))
            else:
                tp_block(s, cfg.compute_s(mlp_s, backward=True))
            tp_block(s, cfg.compute_s(attn_s, backward=True))
        if s > 0:
            b.add([t for ts in grads[(s, i)].values() for t in ts], "pp", receivers_wait=False)

    for s in range(d.pp):
        for kind, i in one_f_one_b(s, d.pp, cfg.micro_batches):
            (forward if kind == "F" else backward)(s, i)
        data_parallel(b, cfg, s, at, layers)
    return b


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """PipeDream-flush: pp-1-stage warm-up forwards, then one forward one backward, then the rest."""
    warm = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warm)]
    for i in range(micro_batches - warm):
        order += [("F", warm + i), ("B", i)]
    order += [("B", i) for i in range(micro_batches - warm, micro_batches)]
    return order


def data_parallel(b: StepBuilder, cfg: TrainStep, s: int, at: dict, layers: int) -> None:
    """Reduce-scatter the stage's gradients, all-reduce across HSDP replicas, all-gather the parameters."""
    d, m = cfg.degrees, cfg.model
    shard = cfg.dp_shard or d.dp
    dense = (m.params_per_layer - (m.experts * m.expert_params if m.moe else 0)) * layers / d.tp
    size = dense * m.dtype_bytes * cfg.scale
    shard_groups = [[at[(t, s, x)] for x in range(r * shard, (r + 1) * shard)]
                    for t in range(d.tp) for r in range(d.dp // shard)]
    replica_groups = [[at[(t, s, x)] for x in range(j, d.dp, shard)] for t in range(d.tp) for j in range(shard)]
    b.collective("reduce_scatter", shard_groups, int(size), "dp")
    if d.dp > shard:
        b.collective("all_reduce", replica_groups, int(size / shard), "dp")
    b.collective("all_gather", shard_groups, int(size), "dp")
    if m.moe:
        experts = m.experts // d.ep * m.expert_params * layers / d.tp * m.dtype_bytes * cfg.scale
        edp = [[at[(t, s, x)] for x in range(e, d.dp, d.ep)] for t in range(d.tp) for e in range(d.ep)]
        b.collective("reduce_scatter", edp, int(experts), "dp")
        b.collective("all_gather", edp, int(experts), "dp")
