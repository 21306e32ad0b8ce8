"""The estimate: α-β per phase, with the bandwidth term stretched by what ECMP leaves each hop.

A phase of a ring collective runs `steps` steps; in each, every hop sends a chunk, and a hop's next
step waits for its predecessor's (labctl.traffic.schedule has the same data dependencies). A hop's
chunk crosses its links at the share of each that it gets: a link carrying k of the phase's flows
gives each 1/k of its capacity. Two things then pace a step, whichever is slower:
- the busiest hop: chunk × max over its links of (flows on the link / capacity);
- the dependency chain around the ring: the mean hop's time plus its store-and-forward latency
  (a chunk waits at every hop, but a hop that waits on a slow one overlaps its own latency).

    T = Σ_phases steps × (α + κ × ranks + max(busiest / η, chain / η + latency))

With several QPs per connection, a hop's messages take its QPs in turn, so each QP carries 1/q of
its bytes and a link's load is its flows averaged over the QPs (measured on the lab: with 4 and 8
QPs the ring's time follows the busiest uplink's share of the bytes). Over hash seeds the time is
a distribution: mean, p50 and p99 are reported.

Parameters: α (NCCL's tuner constants by default, real-fabric time) and η, the fraction of the
payload rate a hop reaches, are the model's. κ, a step's cost per agent sharing the lab's CPUs,
describes the lab, not a fabric: it is fitted on lab runs (calibration.py) so that the model can
be checked against them, and is zero for a real fabric. The model knows no CPU ceiling: lab runs
whose agents together reach the machine's packet rate (README, Performance) are slower than it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from labctl.estimate.collectives import Phase
from labctl.estimate.fabric import NO_LINK, Clos

ROCE_MTU = 4096
FRAME_OVERHEAD = 14 + 20 + 8 + 12 + 4      # Ethernet, IPv4, UDP, BTH, ICRC (traffic.roce.FRAME_OVERHEAD)


@dataclass(frozen=True)
class Params:
    alpha_net_s: float = 14e-6   # NCCL's tuner: a ring step between nodes, Simple protocol
    alpha_nvl_s: float = 3.4e-6  # and one over NVLink
    eta: float = 1.0
    kappa_s: float = 0.0         # lab only: per step, per agent sharing the cores


@dataclass
class PhaseFeatures:
    """What a phase's time depends on, in the fabric's own time (lab time for a lab)."""
    name: str
    steps: int
    ranks: int
    inter: bool                  # a hop leaves a server: α is the network's
    ideal_step_s: float          # the busiest NIC's chunk over its payload rate: the α-β bound's term
    step_s: list[float]          # per hash draw (seed): the busiest hop's chunk time as ECMP leaves it
    chain_s: list[float]         # per hash draw: the mean hop's chunk time
    latency_s: float             # store-and-forward of one frame, mean over the hops
    loads: list[dict] = field(default_factory=list)   # per tier at the first draw

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def payload_Bps(bps):
    """Bytes/s of RDMA payload a link of `bps` carries in 4 KB RoCE frames."""
    return np.asarray(bps, dtype=float) / 8 * ROCE_MTU / (ROCE_MTU + FRAME_OVERHEAD)


def phase_features(fabric: Clos, phase: Phase, seeds: list[int], qps: int = 1, seed_mode: str = "same",
                   spines: list[np.ndarray] | None = None, fixed_sport: bool = False, ranks: int = 0) -> PhaseFeatures:
    """`spines`, per QP, the spine each hop's kernel chose (a lab run's record): then one draw, the real one."""
    cap = payload_Bps(fabric.capacities())
    src, dst = phase.src, phase.dst
    draws = [spines] if spines is not None else [None] * len(seeds)
    per_draw, chain, loads = [], [], []
    for d, seed in enumerate(seeds[:len(draws)]):
        paths = [fabric.paths(src, dst, np.full(len(src), 0 if fixed_sport else k), seed, seed_mode,
                              draws[d][k] if draws[d] is not None else None, fixed_sport) for k in range(qps)]
        # a hop's chunk is spread over its QPs: a link carries, per step, its flows averaged over the QPs
        load = sum(np.bincount(p[p != NO_LINK], minlength=len(cap)) for p in paths) / qps
        hop = np.zeros(len(src))
        for p in paths:
            share = np.where(p != NO_LINK, load[np.maximum(p, 0)] / cap[np.maximum(p, 0)], 0.0)
            hop = np.maximum(hop, share.max(axis=1))
        per_draw.append(float(phase.chunk * hop.max()))
        chain.append(float(phase.chunk * hop.mean()))
        if d == 0:
            loads = tier_loads(fabric, load)
    links = fabric.paths(src, dst, np.zeros(len(src), dtype=np.int64), seeds[0])
    ideal = phase.chunk / cap[links[:, 0]].min()
    frame = ROCE_MTU + FRAME_OVERHEAD
    forward = np.where(links[:, 1:] != NO_LINK, frame / cap[np.maximum(links[:, 1:], 0)], 0.0).sum(axis=1)
    inter = bool((src // fabric.gpus_per_server != dst // fabric.gpus_per_server).any() or fabric.nvlink_bps == 0)
    return PhaseFeatures(phase.name, phase.steps, ranks or len(np.unique(src)), inter, float(ideal), per_draw, chain,
                         float(forward.mean()), loads)


def tier_loads(fabric: Clos, load: np.ndarray) -> list[dict]:
    """Flows per link, per kind of link that the phase uses: mean over used links, max, and the share
    of the tier's links that carry nothing."""
    out = []
    for name, lo, hi in fabric.tier_of_link():
        seg = load[lo:hi]
        if not seg.any():
            continue
        out.append({"tier": name, "links": int(hi - lo), "max_flows": round(float(seg.max()), 3),
                    "mean_flows": float(seg[seg > 0].mean()), "idle": float((seg == 0).mean())})
    return out


def phase_time(f: PhaseFeatures, p: Params, draw: int = 0) -> float:
    alpha = p.alpha_net_s if f.inter else p.alpha_nvl_s
    step = max(f.step_s[draw] / p.eta, f.chain_s[draw] / p.eta + f.latency_s)
    return f.steps * (alpha + p.kappa_s * f.ranks + step)


def ideal_time(features: list[PhaseFeatures], p: Params) -> float:
    """The α-β bound: α and the busiest NIC's bytes at full payload rate, no ECMP, no latency."""
    return sum(f.steps * ((p.alpha_net_s if f.inter else p.alpha_nvl_s) + f.ideal_step_s) for f in features)


def times_over_draws(features: list[PhaseFeatures], p: Params) -> np.ndarray:
    """The collective's time under each hash draw (the phases' draws share a seed)."""
    draws = min(len(f.step_s) for f in features)
    return np.array([sum(phase_time(f, p, d) for f in features) for d in range(draws)])


def lab_params(p: Params, alpha_s: float = 0.0) -> Params:
    """A lab's agents model no NCCL latency: α is what the workload asked for (default 0)."""
    return replace(p, alpha_net_s=alpha_s, alpha_nvl_s=alpha_s)
