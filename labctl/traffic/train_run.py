"""A `train:` workload on a lab: its step as one operation, and what the run says about it.

Per step the run reports the bytes of each parallel dimension (`dim_bytes`), the bytes each
fabric should carry (`fabric_bytes_expected`, payload and on the wire), the step time against
its bound, the duty cycle (per GPU, the share of the step during which one of its transfers was in
flight, averaged over the GPUs; and the share during which any transfer was) and,
of the time the WAN was busy, the share that some rank spent computing: WAN time hidden behind
compute.
"""
from __future__ import annotations

from labctl.plan.model import LabPlan
from labctl.traffic import fabrics
from labctl.traffic import schedule as sch
from labctl.traffic.pool import gpu_ranks
from labctl.traffic.train import TrainStep, build_step
from labctl.traffic.train_model import DIMS
from labctl.traffic.train_spec import located, step_for


def step_config(plan: LabPlan, loaded, ranks: list[int]) -> TrainStep:
    where = located(str(loaded.file), loaded.smap)
    return step_for(loaded.workload.train, len(ranks), plan.dilation, where)


def step_schedule(cfg: TrainStep, ranks: list[int], slice_bytes: int) -> tuple[sch.Schedule, float]:
    """The step's schedule and its compute critical path: 1F1B runs (m + pp - 1) forward+backward
    slots of the busiest stage, the last pp - 1 of them the bubble."""
    b = build_step(cfg, ranks, slice_bytes)
    s = sch.Schedule("train_step", list(ranks), sum(t.nbytes for t in b.transfers), b.transfers)
    per_mb = max(b.compute_total.values()) / cfg.micro_batches
    return s, per_mb * (cfg.micro_batches + cfg.degrees.pp - 1)


def dim_bytes(s: sch.Schedule) -> dict[str, int]:
    out = dict.fromkeys(DIMS, 0)
    for t in s.transfers:
        out[t.phase] = out.get(t.phase, 0) + t.nbytes
    return out


def bubble(cfg: TrainStep) -> float:
    return (cfg.degrees.pp - 1) / (cfg.micro_batches + cfg.degrees.pp - 1)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _overlap(xs, ys) -> float:
    """Length of the intersection of two sorted, disjoint interval lists."""
    total, j = 0.0, 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            total += max(0.0, min(b, ys[k][1]) - max(a, ys[k][0]))
            k += 1
    return total


def _flights(s: sch.Schedule, result: dict, phase: str) -> list[tuple[int, float, float]]:
    """(id, send start, arrival) of the transfers of one dimension."""
    ids = {t.id for t in s.transfers if t.phase == phase}
    start, out = {}, []
    for rep in result["per_rank"].values():
        for x in rep["sends"]:
            if x[0] in ids:
                start[x[0]] = x[1]
    for rep in result["per_rank"].values():
        for x in rep["recvs"]:
            if x[0] in start:
                out.append((x[0], start[x[0]], x[1]))
    return out


def timeline(plan: LabPlan, s: sch.Schedule, result: dict) -> dict:
    """Busy intervals from the agents' reports: transfers in flight (send start to arrival), per
    fabric, and compute (the `delay` before each send)."""
    nodes = gpu_ranks(plan)
    by_id = {t.id: t for t in s.transfers}
    start, arrive = {}, {}
    for rep in result["per_rank"].values():
        for x in rep["sends"]:
            start[x[0]] = x[1]
        for x in rep["recvs"]:
            arrive[x[0]] = x[1]
    flight: dict[str, list] = {f: [] for f in fabrics.FABRICS}
    compute, allflight = [], []
    per_rank: dict[int, list] = {}
    flight_bytes: list[tuple[str, float, float, int]] = []
    fabric_of: dict[tuple[int, int], str] = {}
    for i, t0 in start.items():
        t = by_id[i]
        if t.delay:
            compute.append((t0 - t.delay, t0))
        if i in arrive:
            key = (t.src, t.dst)
            if key not in fabric_of:
                fabric_of[key] = fabrics.pair_fabric(plan, nodes[t.src], nodes[t.dst])
            flight[fabric_of[key]].append((t0, arrive[i]))
            flight_bytes.append((fabric_of[key], t0, arrive[i], t.nbytes))
            allflight.append((t0, arrive[i]))
            per_rank.setdefault(t.src, []).append((t0, arrive[i]))
    return {"flight": _union(allflight), "compute": _union(compute), "load": _binned(flight_bytes, compute, result),
            "rank_busy": {r: _length(_union(v)) for r, v in per_rank.items()},
            "fabrics": {f: _union(v) for f, v in flight.items()}}


def expert_receivers(cfg: TrainStep, s: sch.Schedule, result: dict) -> dict:
    """The expert-parallel bytes each rank received (arrived), the hottest over the mean, and what the
    routing skew says that ratio is."""
    if not cfg.model.moe or cfg.degrees.ep < 2:
        return {}
    by_id = {t.id: t for t in s.transfers if t.phase == "ep"}
    got: dict[int, int] = {}
    for rank, rep in result["per_rank"].items():
        got[int(rank)] = sum(by_id[x[0]].nbytes for x in rep["recvs"] if x[0] in by_id)
    planned: dict[int, int] = {}
    for t in by_id.values():
        planned[t.dst] = planned.get(t.dst, 0) + t.nbytes
    mean = sum(got.values()) / len(got)
    return {"ep_recv_bytes": got, "ep_hot_ratio": max(got.values()) / mean if mean else 0.0,
            "ep_hot_ratio_expected": max(planned.values()) / (sum(planned.values()) / len(got))}


BINS = 100


def _binned(flights, compute, result) -> dict:
    """Each fabric's bytes/s over the step in BINS bins (a transfer's bytes spread over its flight),
    and how many GPUs were computing, on average, in each bin."""
    step = result["time_s"] or 1.0
    width = step / BINS
    out = {f: [0.0] * BINS for f in fabrics.FABRICS}
    busy = [0.0] * BINS

    def spread(a, b, weight, row):
        a, b = max(0.0, a), min(step, max(b, a + 1e-9))
        for k in range(int(a / width), min(BINS, int(b / width) + 1)):
            lo, hi = max(a, k * width), min(b, (k + 1) * width)
            if hi > lo:
                row[k] += weight * (hi - lo) / (b - a)
    for fabric, a, b, nbytes in flights:
        spread(a, b, nbytes / width, out[fabric])
    for a, b in compute:
        spread(a, b, (b - a) / width, busy)
    return {"bin_s": width, "Bps": out, "computing": busy}


def summary(plan: LabPlan, cfg: TrainStep, s: sch.Schedule, result: dict, compute_path: float) -> dict:
    nodes = gpu_ranks(plan)
    tl = timeline(plan, s, result)
    ep_flight = _union([(x[1], x[2]) for x in _flights(s, result, "ep")])
    step = result["time_s"]
    wan = tl["fabrics"]["scaleacross"]
    wan_busy = _length(wan)
    m = cfg.model
    return {
        "model": {"layers": m.layers, "hidden": m.hidden, "experts": m.experts, "top_k": m.top_k,
                  "params": m.params, "dtype": m.dtype},
        "degrees": {"tp": cfg.degrees.tp, "pp": cfg.degrees.pp, "dp": cfg.degrees.dp, "ep": cfg.degrees.ep},
        "placement": list(cfg.placement), "micro_batches": cfg.micro_batches, "scale": cfg.scale,
        "dim_bytes": dim_bytes(s),
        # where each dimension landed: what placement decides, and what the user came to see
        "dim_fabric_bytes": {d: {f: n for f, n in fabrics.expected(plan, nodes, [t for t in s.transfers
                                                                                  if t.phase == d]).items() if n}
                             for d in DIMS},
        "fabric_bytes_expected": fabrics.expected(plan, nodes, s.transfers),
        "lab_fabrics": fabrics.present(plan),
        "fabric_wire_bytes_expected": fabrics.expected(plan, nodes, s.transfers, wire=True),
        "step_time_s": step, "compute_path_s": compute_path, "ideal_s": result["ideal_s"],
        "bubble_fraction": bubble(cfg),
        # what one GPU's port sees: the share of the step its own transfers were in flight
        "duty_cycle": sum(tl["rank_busy"].values()) / len(s.ranks) / step if step > 0 else 0.0,
        "network_busy_fraction": _length(tl["flight"]) / step if step > 0 else 0.0,
        "fabric_busy_s": {f: _length(v) for f, v in tl["fabrics"].items()},
        "wan_busy_s": wan_busy,
        "wan_hidden_fraction": _overlap(wan, tl["compute"]) / wan_busy if wan_busy else None,
        "ep_busy_s": _length(ep_flight),
        **expert_receivers(cfg, s, result),
        "load": tl["load"],
        "bursts": {"flight": tl["flight"][:2000], "compute": tl["compute"][:2000]},
    }
