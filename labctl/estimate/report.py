"""`labctl estimate`: the model's figures for one collective on one fabric, and its check against runs."""
from __future__ import annotations

import numpy as np

from labctl.errors import InputError, LabError
from labctl.estimate.fabric import OPTION
from labctl.estimate import calibration, collectives, labrun
from labctl.estimate.fabric import Clos
from labctl.estimate.model import Params, ideal_time, phase_features, times_over_draws
from labctl.traffic.schedule import bus_factor
from labctl.units import format_rate

MODEL_NOTE = ("This is a model, not an emulation: α-β per ring step, with each hop's bandwidth divided by the "
              "flows ECMP puts on its busiest link (the lab's 5-tuple hash model: QP-derived UDP ports, "
              "hash-threshold next hops, drawn over hash seeds). It knows no congestion control, PFC, buffers "
              "or NIC internals.")


def ranks_order(fabric: Clos, ranks: str) -> np.ndarray:
    """`all`: every GPU, server by server; `rail`: GPU 0 of every server; N: the first N GPUs."""
    if ranks == "all":
        return np.arange(fabric.gpus)
    if ranks == "rail":
        return np.arange(0, fabric.gpus, fabric.gpus_per_server)
    try:
        n = int(ranks)
    except ValueError:
        raise InputError(OPTION("--ranks"), f"{ranks!r}: give all, rail or a number", "e.g. --ranks 4096") from None
    if not 2 <= n <= fabric.gpus:
        raise InputError(OPTION("--ranks"), f"{n}: the fabric has {fabric.gpus} GPUs", f"give 2..{fabric.gpus}")
    return np.arange(n)


def estimate(fabric: Clos, collective: str, order: np.ndarray, size: float, params: Params, qps: int = 1,
             seeds: int = 32, seed_mode: str = "per-switch") -> dict:
    feats = [phase_features(fabric, ph, list(range(1, seeds + 1)), qps, seed_mode, ranks=len(order))
             for ph in collectives.phases(collective, order, size, fabric.gpus_per_server)]
    times = times_over_draws(feats, params)
    bound = ideal_time(feats, params)
    n = len(order)
    return {"collective": collective, "ranks": n, "size": size, "qps": qps, "seeds": seeds, "seed_mode": seed_mode,
            "bound_s": bound, "mean_s": float(times.mean()), "p50_s": float(np.percentile(times, 50)),
            "p99_s": float(np.percentile(times, 99)), "worst_s": float(times.max()),
            "busbw_GBps": size / times.mean() * bus_factor(collective, n) / 1e9,
            "phases": [{"name": f.name, "steps": f.steps, "bound_s": f.steps * f.ideal_step_s,
                        "slowdown_mean": float(np.mean(f.step_s)) / f.ideal_step_s, "loads": f.loads} for f in feats]}


def describe(fabric: Clos) -> str:
    tiers = (f"{fabric.leaves} leaves, {fabric.spines} spines" if fabric.tiers == 2 else
             f"{fabric.leaves} leaves and {fabric.spines} spines in each of {fabric.pods} pods, "
             f"{fabric.spines * fabric.cores_per_plane} cores")
    return (f"{fabric.gpus:,} GPUs ({fabric.gpus // fabric.gpus_per_server:,} servers x {fabric.gpus_per_server}), "
            f"rail-optimised {fabric.tiers}-tier Clos: {tiers}; NIC {format_rate(fabric.nic_bps)}"
            + (f", NVLink {format_rate(fabric.nvlink_bps)}" if fabric.nvlink_bps else ""))


def text(result: dict, cal: dict) -> str:
    r = result
    lines = [f"{r['collective']} of {r['size'] / 1e6:,.0f} MB over {r['ranks']:,} ranks, {r['qps']} QP(s) per "
             f"connection, {r['seeds']} hash draws ({r['seed_mode']} seeds)",
             f"  α-β bound      {r['bound_s'] * 1e3:12.3f} ms",
             f"  estimate mean  {r['mean_s'] * 1e3:12.3f} ms  ({r['mean_s'] / r['bound_s']:.2f}x the bound; busbw "
             f"{r['busbw_GBps']:.1f} GB/s)",
             f"  p50 / p99      {r['p50_s'] * 1e3:12.3f} / {r['p99_s'] * 1e3:.3f} ms (worst draw {r['worst_s'] * 1e3:.3f})"]
    for ph in r["phases"]:
        lines.append(f"  phase {ph['name']}: {ph['steps']:,} steps, bandwidth term {ph['slowdown_mean']:.2f}x "
                     "the unloaded hop (mean over draws)")
        for t in ph["loads"]:
            if t["tier"].startswith(("leaf", "spine", "core")):
                lines.append(f"    {t['tier']:<12} {t['links']:>7,} links: flows per used link mean "
                             f"{t['mean_flows']:.2f}, max {t['max_flows']}; idle {t['idle']:.0%} (seed 1)")
    lines.append(calibration_line(cal))
    lines.append(MODEL_NOTE)
    return "\n".join(lines)


def calibration_line(cal: dict) -> str:
    ranks = [row["ranks"] for row in cal["rows"]]
    return (f"Calibrated on {len(cal['rows'])} lab runs at {min(ranks)}-{max(ranks)} ranks ({cal.get('provenance', '')}): "
            f"eta {cal['params']['eta']:.3f}; on a run it was not fitted on the model is off by at most "
            f"{cal['max_error']:.1%} (mean {cal['mean_error']:.1%}); one lab run also differs from the next by up to "
            f"{calibration.RUN_TO_RUN:.0%}, so `--check` allows {allowed_error(cal):.1%}.")


def allowed_error(cal: dict) -> float:
    """What `--check` allows: the fit's worst leave-one-out error plus what one run differs from the next."""
    return cal["max_error"] + calibration.RUN_TO_RUN


def check_runs(run_dirs: list[str], cal: dict) -> tuple[list[dict], bool]:
    """Predict each run with the calibrated lab parameters; all within the calibration's error (the
    fit's worst leave-one-out error plus what one run differs from the next)?"""
    p = calibration.lab_params_of(cal)
    rows, ok = [], True
    for d in run_dirs:
        for s in labrun.samples(d):
            predicted = calibration.predict(s, p)
            err = predicted / s["measured_s"] - 1
            within = abs(err) <= allowed_error(cal)
            ok &= within
            rows.append({"run": d, "collective": s["collective"], "size": s["size"], "ranks": s["ranks"],
                         "measured_s": s["measured_s"], "predicted_s": predicted, "error": err,
                         "within": within, "placement": s["placement"]})
    if not rows:
        raise LabError("no modelled collective in the runs given",
                       f"give runs of {', '.join(collectives.COLLECTIVES)}")
    return rows, ok
