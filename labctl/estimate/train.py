"""A training step's bytes per fabric and its α-β time, for a lab or for 8k-100k GPUs (pure logic).

The cluster is a hierarchy: scale-up domains of `domain` GPUs, zones (buildings) of `zone` GPUs,
the zones joined by a WAN of `wan_Bps` each way and `wan_latency_s` one way. Participant i sits in
domain i // domain and zone i // zone, as a lab's ranks do; the placement decides which parallel
dimension spans which level (train_model.coordinates).

Bytes: every group of every dimension is walked, each hop's bytes counted on the outermost fabric
it crosses, with the schedules' own per-hop formulas (a ring hop carries (k-1)/k x S per
reduce-scatter or all-gather, twice that per all-reduce), so for a lab they equal the schedule's.

Time: each ring collective is α-β, steps x (α + the slowest hop's chunk over its rate), never less
than the bytes crossing the WAN over its capacity, plus its propagation: the delays along the
longest chain of transfers that wait for one another. A slice goes round the ring hop by hop, so
a ring pays a one-way delay at every hop of a slice's way, and the WAN's only where the ring
crosses it (four times for a two-zone ring all-reduce), not at every step. The pipeline is played
as 1F1B, op by op (a stage's forward waits for the previous stage's activation to arrive, its
backward for the next stage's gradient), and each stage's data-parallel collectives start once
its last backward is done: so the WAN's latency costs pp placement a round trip per chain of
micro-batches, and dp placement a few one-way delays once, after the backward.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from labctl.traffic.train import TrainStep
from labctl.traffic.train_model import coordinates, rank_loads, skew_weights

FABRICS = ("scaleup", "scaleout", "scaleacross", "frontend")


@dataclass(frozen=True)
class Cluster:
    gpus: int
    domain: int                    # GPUs per scale-up (NVLink) domain; 1: none
    zone: int                      # GPUs per zone (building)
    Bps: dict                      # per-GPU payload bytes/s per fabric (scaleup, scaleout, scaleacross)
    latency_s: dict                # one-way per fabric
    wan_Bps: float = float("inf")  # the WAN's capacity each way, shared by every crossing flow
    alpha_s: float = 0.0           # software latency per collective step (NCCL: 14 us between servers)

    def fabric(self, i: int, j: int) -> str:
        if i // self.domain == j // self.domain:
            return "scaleup"
        if i // self.zone == j // self.zone:
            return "scaleout"
        return "scaleacross"


def layout(cfg: TrainStep, n: int) -> dict:
    coords = coordinates(n, cfg.degrees, cfg.placement)
    return {(c["tp"], c["pp"], c["dp"]): i for i, c in enumerate(coords)}


def groups(cfg: TrainStep, n: int) -> dict[str, dict]:
    """Per dimension and stage, the participant-index groups (rings in order)."""
    return _groups(cfg.degrees, cfg.placement, cfg.dp_shard, n)


@lru_cache(maxsize=16)
def _groups(d, placement, dp_shard, n: int) -> dict[str, dict]:
    coords = coordinates(n, d, placement)
    at = {(c["tp"], c["pp"], c["dp"]): i for i, c in enumerate(coords)}
    shard = dp_shard or d.dp
    out = {"tp": {}, "ep": {}, "dp_shard": {}, "dp_replica": {}, "edp": {}}
    for s in range(d.pp):
        out["tp"][s] = [[at[(t, s, x)] for t in range(d.tp)] for x in range(d.dp)]
        out["ep"][s] = [[at[(t, s, x)] for x in range(e * d.ep, (e + 1) * d.ep)]
                        for t in range(d.tp) for e in range(d.dp // d.ep)]
        out["dp_shard"][s] = [[at[(t, s, x)] for x in range(r * shard, (r + 1) * shard)]
                              for t in range(d.tp) for r in range(d.dp // shard)]
        out["dp_replica"][s] = [[at[(t, s, x)] for x in range(j, d.dp, shard)]
                                for t in range(d.tp) for j in range(shard)]
        out["edp"][s] = [[at[(t, s, x)] for x in range(e, d.dp, d.ep)] for t in range(d.tp) for e in range(d.ep)]
    out["pp"] = {s: [(at[(t, s, x)], at[(t, s + 1, x)]) for x in range(d.dp) for t in range(d.tp)]
                 for s in range(d.pp - 1)}
    return out


def sizes(cfg: TrainStep) -> dict[str, float]:
    """Per operation, in bytes (scaled as the lab's): b*s*h, a stage's dense and expert shards."""
    m, d = cfg.model, cfg.degrees
    layers = m.layers // d.pp
    dense = (m.params_per_layer - (m.experts * m.expert_params if m.moe else 0)) * layers / d.tp
    experts = m.experts // d.ep * m.expert_params * layers / d.tp if m.moe else 0
    return {"act": cfg.activation_bytes * cfg.scale, "dense": dense * m.dtype_bytes * cfg.scale,
            "experts": experts * m.dtype_bytes * cfg.scale, "layers": layers}


def _ring_hops(group):
    return [(group[i], group[(i + 1) % len(group)]) for i in range(len(group))] if len(group) > 1 else []


def step_bytes(cfg: TrainStep, cl: Cluster) -> tuple[dict, dict]:
    """(bytes per dimension, bytes per fabric) of one step, summed over all GPUs."""
    d, m = cfg.degrees, cfg.model
    g, z = groups(cfg, cl.gpus), sizes(cfg)
    mb, layers = cfg.micro_batches, z["layers"]
    dims = dict.fromkeys(("tp", "pp", "dp", "ep"), 0.0)
    fab = dict.fromkeys(FABRICS, 0.0)

    def ring(dim, grps, size, factor):
        for grp in grps:
            k = len(grp)
            for a, b in _ring_hops(grp):
                nbytes = factor * (k - 1) / k * size
                dims[dim] += nbytes
                fab[cl.fabric(a, b)] += nbytes

    loads = rank_loads(skew_weights(cfg.skew, m.experts), d.ep) if m.moe and d.ep > 1 else []
    per_dst = [z["act"] / d.tp * m.top_k * q for q in loads]
    for s in range(d.pp):
        ring("tp", g["tp"][s], z["act"], 2 * 4 * layers * mb)     # 4 all-reduces per layer and micro-batch
        if not cfg.sequence_parallel:       # a received micro-batch's 1/tp shares all-gathered
            ring("tp", g["tp"][s], z["act"], mb * ((s > 0) + (s < d.pp - 1)))
        if loads:
            for grp in g["ep"][s]:
                for i, a in enumerate(grp):
                    for j, b in enumerate(grp):
                        if i != j:
                            nbytes = 2 * mb * layers * (per_dst[j] + per_dst[i])   # dispatch + combine, fwd + bwd
                            dims["ep"] += nbytes
                            fab[cl.fabric(a, b)] += nbytes
        shard = cfg.dp_shard or d.dp
        ring("dp", g["dp_shard"][s], z["dense"], 2)               # reduce-scatter + all-gather
        if d.dp > shard:
            ring("dp", g["dp_replica"][s], z["dense"] / shard, 2)
        if m.moe:
            ring("dp", g["edp"][s], z["experts"], 2)
    for s, pairs in g["pp"].items():
        for a, b in pairs:
            nbytes = 2 * mb * z["act"] / d.tp
            dims["pp"] += nbytes
            fab[cl.fabric(a, b)] += nbytes / 2
            fab[cl.fabric(b, a)] += nbytes / 2
    return dims, fab


HOP_FABRICS = FABRICS[:3]


@lru_cache(maxsize=16)
def _ring_arrays(d, placement, dp_shard, n: int) -> dict[str, dict]:
    """groups() as arrays: per dimension and stage, {size: (groups, size) participant indices}."""
    out = {}
    for dim, per_stage in _groups(d, placement, dp_shard, n).items():
        if dim == "pp":
            continue
        out[dim] = {}
        for s, grps in per_stage.items():
            by_size: dict[int, list] = {}
            for grp in grps:
                by_size.setdefault(len(grp), []).append(grp)
            out[dim][s] = {k: np.asarray(v, dtype=np.int64) for k, v in by_size.items() if k > 1}
    return out


def _hop_fabrics(cl: Cluster, rings: np.ndarray) -> np.ndarray:
    """Per ring hop (member i to member i+1), the index in HOP_FABRICS of the fabric it crosses."""
    a, b = rings, np.roll(rings, -1, axis=1)
    return np.where(a // cl.domain == b // cl.domain, 0, np.where(a // cl.zone == b // cl.zone, 1, 2))


def _collective_s(cl: Cluster, rings: dict, size: float, passes: int, wire_factor: float) -> float:
    """A ring collective over disjoint groups at once, without propagation (_propagate's): α-β, each
    of its passes x (k-1) steps taking α and the slowest hop's chunk, bounded by the WAN's capacity."""
    worst, crossing = 0.0, 0.0
    rates = np.array([cl.Bps[f] for f in HOP_FABRICS])
    for k, grps in rings.items():
        hops = _hop_fabrics(cl, grps)
        worst = max(worst, passes * (k - 1) * (cl.alpha_s + size / k / rates[hops].min()))
        crossing += wire_factor * (k - 1) / k * size * np.count_nonzero(hops == 2)
    return float(max(worst, crossing / 2 / cl.wan_Bps)) if worst else 0.0


def _propagate(cl: Cluster, rings: dict, passes: int, ready: np.ndarray) -> None:
    """Propagation along the longest chain of transfers that wait for one another. Each slice goes passes x (k-1) hops round its ring,
    a step waiting only for the slice's own arrival, so a two-zone ring all-reduce pays four WAN
    crossings, not one per step; a rank's next collective waits for everything it received.
    `ready` (per participant, propagation so far) becomes each member's after this collective."""
    lats = np.array([cl.latency_s[f] for f in HOP_FABRICS])
    for k, grps in rings.items():
        hops = passes * (k - 1)
        lat = lats[_hop_fabrics(cl, grps)]
        span = k + hops                                   # unrolled positions 0 .. k-1+hops
        reps = -(-(span - 1) // k)
        at = np.zeros((len(grps), span))
        at[:, 1:] = np.cumsum(np.tile(lat, reps)[:, :span - 1], axis=1)   # from position 0 to t
        start = ready[grps] - at[:, :k]                   # a slice leaving member p, less the way to p
        first = np.maximum.accumulate(start, axis=1)      # max over p <= j
        last = np.maximum.accumulate(start[:, ::-1], axis=1)[:, ::-1]   # max over p >= j
        t = np.arange(1, span)
        # the slices reaching position t left p in [t-hops, t-1] clipped to [0, k-1]: with hops >= k-1
        # that is a prefix of the members (t <= hops) or a suffix
        best = np.where(t <= hops, first[:, np.minimum(t - 1, k - 1)], last[:, np.clip(t - hops, 0, k - 1)])
        arrive = np.full((len(grps), reps * k + k), -np.inf)
        arrive[:, 1:span] = best + at[:, 1:]
        ready[grps] = np.maximum(ready[grps], arrive.reshape(len(grps), -1, k).max(axis=1))


def _ring_time(cl: Cluster, rings: dict, size: float, passes: int, wire_factor: float) -> float:
    """One collective from a standing start: α-β plus its longest chain's propagation."""
    ready = np.zeros(cl.gpus)
    _propagate(cl, rings, passes, ready)
    return _collective_s(cl, rings, size, passes, wire_factor) + float(ready.max())


def step_time(cfg: TrainStep, cl: Cluster) -> dict:
    """The α-β step: 1F1B played op by op, then each stage's data-parallel collectives."""
    d, m = cfg.degrees, cfg.model
    g, z = groups(cfg, cl.gpus), sizes(cfg)
    rings = _ring_arrays(cfg.degrees, cfg.placement, cfg.dp_shard, cl.gpus)
    layers = z["layers"]
    f_compute = sum(cfg.compute_s(p) for p in (m.attention_params, m.top_k * m.expert_params)) * layers
    tp = {s: 4 * layers * _ring_time(cl, rings["tp"][s], z["act"], 2, 2) / 2 for s in range(d.pp)}
    ep = {s: 0.0 for s in range(d.pp)}
    if m.moe and d.ep > 1:
        loads = rank_loads(skew_weights(cfg.skew, m.experts), d.ep)
        hottest = max(loads) * z["act"] / d.tp * m.top_k * (d.ep - 1)
        for s in range(d.pp):
            f = max((cl.fabric(a, b) for grp in g["ep"][s] for a in grp for b in grp if a != b), key=FABRICS.index)
            ep[s] = 4 * layers * (cl.alpha_s + cl.latency_s[f] + hottest / cl.Bps[f]) / 2
    p2p = {}
    for s, pairs in g["pp"].items():
        f = max((cl.fabric(a, b) for a, b in pairs), key=FABRICS.index)
        p2p[s] = cl.alpha_s + cl.latency_s[f] + z["act"] / d.tp / cl.Bps[f]
    # without sequence parallelism a received micro-batch is all-gathered over tp before it is used
    gather = {s: 0.0 if cfg.sequence_parallel else _ring_time(cl, rings["tp"][s], z["act"], 1, 1)
              for s in range(d.pp)}
    fwd = {s: f_compute + tp[s] + ep[s] + (gather[s] if s > 0 else 0.0) for s in range(d.pp)}
    bwd = {s: 2 * f_compute + tp[s] + ep[s] + (gather[s] if s < d.pp - 1 else 0.0) for s in range(d.pp)}
    end = _one_f_one_b(d.pp, cfg.micro_batches, fwd, bwd, p2p)
    shard = cfg.dp_shard or d.dp
    step, dp_s = 0.0, {}
    for s in range(d.pp):
        # in the lab's order (traffic.train.data_parallel), one chain of propagation through them all
        ops = [(rings["dp_shard"][s], z["dense"], 1, 1)]
        if d.dp > shard:
            ops.append((rings["dp_replica"][s], z["dense"] / shard, 2, 2))
        ops.append((rings["dp_shard"][s], z["dense"], 1, 1))
        if m.moe:
            ops += [(rings["edp"][s], z["experts"], 1, 1)] * 2
        ready = np.zeros(cl.gpus)
        t = 0.0
        for grps, size, passes, wire in ops:
            t += _collective_s(cl, grps, size, passes, wire)
            _propagate(cl, grps, passes, ready)
        dp_s[s] = t + float(ready.max())
        step = max(step, end[s] + dp_s[s])
    compute = (cfg.micro_batches + d.pp - 1) * 3 * f_compute
    return {"step_s": step, "compute_path_s": compute, "pipeline_s": max(end.values()), "dp_s": max(dp_s.values()),
            "tp_s_per_micro_batch": max(tp.values()) * 2, "ep_s_per_micro_batch": max(ep.values()) * 2,
            # a middle stage gathers twice per micro-batch (forward and backward receives), an end stage once
            "pp_gather_s_per_micro_batch": max(gather[s] * ((s > 0) + (s < d.pp - 1)) for s in range(d.pp)),
            "p2p_s": max(p2p.values()) if p2p else 0.0}


def _one_f_one_b(pp: int, mb: int, fwd: dict, bwd: dict, p2p: dict) -> dict[int, float]:
    """When each stage's last backward ends, playing each stage's 1F1B order with its dependencies."""
    from labctl.traffic.train import one_f_one_b
    orders = {s: one_f_one_b(s, pp, mb) for s in range(pp)}
    pos = {(s, op): k for s in range(pp) for k, op in enumerate(orders[s])}

    @lru_cache(maxsize=None)
    def finish(s: int, k: int) -> float:
        kind, i = orders[s][k]
        ready = finish(s, k - 1) if k else 0.0
        if kind == "F" and s > 0:
            ready = max(ready, finish(s - 1, pos[(s - 1, ("F", i))]) + p2p[s - 1])
        if kind == "B" and s < pp - 1:
            ready = max(ready, finish(s + 1, pos[(s + 1, ("B", i))]) + p2p[s])
        return ready + (fwd[s] if kind == "F" else bwd[s])

    import sys
    sys.setrecursionlimit(max(10000, 8 * pp * mb))
    return {s: finish(s, len(orders[s]) - 1) for s in range(pp)}


def flip_distance_km(cfg_a: TrainStep, cfg_b: TrainStep, cluster_at, km_max: float = 20000.0) -> float | None:
    """The WAN distance at which placement a and b take the same time (bisection), if it is in
    [0, km_max]; `cluster_at(km)` builds the cluster at a distance. None when there is none, or when
    the two are one layout (a dimension of degree 1 swapped), which tie everywhere."""
    if same_layout(cfg_a, cfg_b, cluster_at(0.0).gpus):
        return None

    def diff(km):
        return step_time(cfg_a, cluster_at(km))["step_s"] - step_time(cfg_b, cluster_at(km))["step_s"]
    lo, hi = 0.0, km_max
    a, b = diff(lo), diff(hi)
    if a == 0:
        return 0.0
    if (a > 0) == (b > 0):
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        if (diff(mid) > 0) == (a > 0):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def with_placement(cfg: TrainStep, placement) -> TrainStep:
    return replace(cfg, placement=tuple(placement))


def same_layout(cfg_a: TrainStep, cfg_b: TrainStep, n: int) -> bool:
    """Whether the two placements give every participant the same coordinates."""
    return cfg_a.degrees == cfg_b.degrees and layout(cfg_a, n) == layout(cfg_b, n)


def lab_cluster(plan, ranks: list[int], alpha_s: float = 0.0, distance_km: float | None = None) -> Cluster:
    """The cluster a lab is, in lab time: its ports' payload rates, the WAN's delay and capacity.
    `distance_km` replaces the WAN's length (5 us/km of fibre, times the dilation)."""
    from labctl.kinds import fabric_kind
    from labctl.traffic.bound import payload_rate
    from labctl.traffic.pool import gpu_ranks
    nodes = gpu_ranks(plan)
    first = nodes[ranks[0]]
    zone = sum(1 for r in ranks if nodes[r].zone == first.zone)
    server = [r for r in ranks if nodes[r].server == first.server]
    kinds = {fabric_kind(plan.fabrics[i.fabric].kind).name: i for i in first.interfaces}
    domain = len(server) if "scale-up" in kinds else 1
    nic = payload_rate(plan, kinds["scale-out"]) if "scale-out" in kinds else payload_rate(plan, first.interfaces[0])
    up = payload_rate(plan, kinds["scale-up"]) if "scale-up" in kinds else nic
    wan = [lk for lk in plan.links if fabric_kind(plan.fabrics[lk.fabric].kind).name == "scale-across"]
    wan_Bps = sum(lk.lab_rate_bps for lk in wan) / 8 * 4096 / (4096 + 62) if wan else float("inf")
    if distance_km is not None:
        wan_lat = distance_km * 5e-6 * plan.dilation
    else:
        wan_lat = max((lk.lab_delay_ns for lk in wan), default=0) / 1e9
    return Cluster(len(ranks), domain, zone, {"scaleup": up, "scaleout": nic, "scaleacross": nic},
                   {"scaleup": 0.0, "scaleout": 0.0, "scaleacross": wan_lat}, wan_Bps, alpha_s)


def real_cluster(gpus: int, domain: int, nic_bps: float, nvlink_bps: float, zones: int, distance_km: float,
                 wan_bps: float, alpha_s: float) -> Cluster:
    """A real cluster: payload rates in 4 KB RoCE frames, 5 us of fibre per km."""
    payload = 4096 / (4096 + 62) / 8
    nic = nic_bps * payload
    return Cluster(gpus, domain if nvlink_bps else 1, gpus // zones,
                   {"scaleup": nvlink_bps / 8 if nvlink_bps else nic, "scaleout": nic, "scaleacross": nic},
                   {"scaleup": 0.0, "scaleout": 2e-6, "scaleacross": distance_km * 5e-6}, wan_bps * payload, alpha_s)


def estimate_file(path, gpus: int, domain: int, nic_bps: float, nvlink_bps: float, zones: int, distance_km: float,
                  wan_bps: float, alpha_s: float) -> dict:
    """`labctl estimate --train`: the workload's step at real size on `gpus` GPUs."""
    from labctl.errors import InputError
    from labctl.estimate.fabric import OPTION
    from labctl.traffic.train_spec import located, step_for
    from labctl.traffic.workload import load_workload
    loaded = load_workload(path)
    spec = loaded.workload.train
    if spec is None:
        raise InputError(OPTION("--train"), f"{path} has no train: key", "give a workload with train:")
    if gpus % zones or (gpus // zones) % domain:
        raise InputError(OPTION("--zones"), f"{gpus} GPUs do not split into {zones} zones of whole "
                         f"{domain}-GPU domains", "choose --gpus a multiple of zones x gpus-per-server")
    spec = spec.model_copy(update={"scale": 1.0, "degrees": spec.degrees.model_copy(update={"dp": None})})
    cfg = replace(step_for(spec, gpus, 1.0, located(str(path), loaded.smap)), time_factor=1.0)
    cl = real_cluster(gpus, domain, nic_bps, nvlink_bps, zones, distance_km, wan_bps, alpha_s)
    dims, fab = step_bytes(cfg, cl)
    out = {"workload": loaded.workload.name, "gpus": gpus, "zones": zones, "distance_km": distance_km,
           "degrees": cfg.degrees.__dict__, "placement": list(cfg.placement), "dim_bytes": dims,
           "fabric_bytes": fab, "time": step_time(cfg, cl)}
    if zones > 1:
        swapped = with_placement(cfg, list(cfg.placement[:-2]) + [cfg.placement[-1], cfg.placement[-2]])
        out["swapped_placement"] = list(swapped.placement)
        out["swapped_step_s"] = step_time(swapped, cl)["step_s"]
        out["same_layout"] = same_layout(cfg, swapped, gpus)
        out["flip_km"] = flip_distance_km(cfg, swapped, lambda km: real_cluster(
            gpus, domain, nic_bps, nvlink_bps, zones, km, wan_bps, alpha_s))
    return out


def text(r: dict) -> str:
    d = r["degrees"]
    lines = [f"{r['workload']} on {r['gpus']:,} GPUs in {r['zones']} zone(s), tp={d['tp']} pp={d['pp']} dp={d['dp']} "
             f"ep={d['ep']}, placement {r['placement']} (an alpha-beta model, not an emulation)",
             "bytes per step, all GPUs: " + ", ".join(f"{k} {v / 1e9:,.1f} GB" for k, v in r["fabric_bytes"].items()),
             "per dimension: " + ", ".join(f"{k} {v / 1e9:,.1f} GB" for k, v in r["dim_bytes"].items()),
             f"step {r['time']['step_s'] * 1e3:,.1f} ms (compute path {r['time']['compute_path_s'] * 1e3:,.1f} ms, "
             f"pipeline {r['time']['pipeline_s'] * 1e3:,.1f} ms, data parallel {r['time']['dp_s'] * 1e3:,.1f} ms)"]
    if r.get("same_layout"):
        lines.append(f"placement {r['swapped_placement']} is the same layout (a dimension of degree 1 swapped): "
                     "no other placement to compare")
    elif "flip_km" in r:
        flip = "no flip below 20,000 km" if r["flip_km"] is None else f"they tie at {km(r['flip_km'])} km"
        lines.append(f"placement {r['swapped_placement']} instead: {r['swapped_step_s'] * 1e3:,.1f} ms; {flip}")
    return "\n".join(lines)


def km(x: float) -> str:
    """Two significant figures below 10 km (a lab's flip is often under one), whole km above."""
    return f"{x:.2g}" if x < 10 else f"{x:,.0f}"
