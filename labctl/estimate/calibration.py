"""Fitting the model to the lab's measured runs, and how well it then predicts them.

Two parameters are fitted on samples (labrun.samples), in lab time:
- η, the fraction of a hop's payload rate that a transfer reaches;
- κ, a step's cost per agent sharing the lab's cores (the agents wake, post and reap per step).
κ describes the lab's CPU. Only η, and the check that the model's shape holds, carry over to a
real fabric. The runs are network-bound ones: their dilation keeps the agents together below the
machine's packet rate, the regime in which the lab emulates a fabric rather than a CPU.

The error reported is leave-one-out: each sample predicted by a fit made without it, so the figure
is what the model does on a run it has not seen. `bench/calibrate_estimate.py` runs the lab
collectives and writes calibration.json beside this module.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from labctl.errors import InputError, LabError, Where
from labctl.estimate import labrun
from labctl.estimate.model import Params, lab_params, phase_time

BUNDLED = Path(__file__).with_name("calibration.json")
# How far one lab run can land from another of the same workload on the same lab (the spread is in
# docs/design.md §8). An idle calibration fits tighter than this, so a check against the fit's
# error alone would fail on a run's own noise.
RUN_TO_RUN = 0.04
ETAS = np.round(np.arange(0.60, 1.0001, 0.001), 3)


def predict(sample: dict, p: Params) -> float:
    return sum(phase_time(f, p) for f in labrun.features(sample))


def _terms(samples: list[dict]):
    """Per phase (rows): its sample, steps × ranks, steps × the busiest hop, × the mean hop, × latency."""
    rows = [(i, f.steps * f.ranks, f.steps * f.step_s[0], f.steps * f.chain_s[0], f.steps * f.latency_s)
            for i, s in enumerate(samples) for f in labrun.features(s)]
    return tuple(np.array(c, dtype=float) for c in zip(*rows))


def fit(samples: list[dict]) -> Params:
    """η on a grid, κ ≥ 0 by least squares on the relative error (it enters linearly)."""
    if not samples:
        raise LabError("no samples to calibrate on", "give run directories of ring or hierarchical collectives")
    idx, per_agent, busiest, chain, lat = _terms(samples)
    idx = idx.astype(int)
    n = len(samples)
    measured = np.array([s["measured_s"] for s in samples])
    a = np.bincount(idx, per_agent, n) / measured
    phase = np.maximum(busiest[:, None] / ETAS[None, :], chain[:, None] / ETAS[None, :] + lat[:, None])
    base = np.stack([np.bincount(idx, phase[:, e], n) for e in range(len(ETAS))], axis=1) / measured[:, None]
    kappa = np.maximum(0.0, (a @ (1 - base)) / (a @ a)) if a.any() else np.zeros(len(ETAS))
    err = ((base + kappa[None, :] * a[:, None] - 1) ** 2).sum(axis=0)
    e = int(err.argmin())
    return lab_params(Params(eta=float(ETAS[e]), kappa_s=float(kappa[e])))


def evaluate(samples: list[dict]) -> dict:
    """The fit on all samples, and each sample's error under it and under a fit without it."""
    p = fit(samples)
    rows = []
    for i, s in enumerate(samples):
        rest = samples[:i] + samples[i + 1:]
        loo = fit(rest) if rest else p
        rows.append({"run": s["run"], "workload": s["workload"], "collective": s["collective"], "size": s["size"],
                     "ranks": s["ranks"], "qps": s["qps"], "dilation": s["dilation"], "measured_s": s["measured_s"],
                     "lab_ideal_s": s["lab_ideal_s"], "predicted_s": predict(s, p),
                     "fit_error": predict(s, p) / s["measured_s"] - 1,
                     "loo_error": predict(s, loo) / s["measured_s"] - 1})
    loo = [abs(r["loo_error"]) for r in rows]
    return {"params": {"eta": p.eta, "kappa_s": p.kappa_s},
            "max_error": max(loo), "mean_error": float(np.mean(loo)), "rows": rows}


def save(result: dict, samples: list[dict], path: Path, provenance: str) -> None:
    path.write_text(json.dumps({"provenance": provenance, **result, "samples": samples}, indent=1) + "\n")


def load(path: Path = BUNDLED) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(Where(str(path)), "no calibration here", "run `sudo .venv/bin/python bench/calibrate_estimate.py`, or "
                       "`labctl estimate --calibrate RUN_DIR...`") from None
    except json.JSONDecodeError as exc:
        raise InputError(Where(str(path), exc.lineno), f"not a calibration file ({exc.msg})",
                         "write it again with --calibrate") from None
    for key in ("params", "max_error", "mean_error", "rows"):
        if key not in doc:
            raise InputError(Where(str(path), key=key), "missing: this is not a calibration file",
                             "write it again with --calibrate")
    return doc


def params_of(doc: dict) -> Params:
    """The calibrated η for a real fabric (the lab's CPU terms stay in the lab)."""
    return Params(eta=float(doc["params"]["eta"]))


def lab_params_of(doc: dict) -> Params:
    q = doc["params"]
    return lab_params(Params(eta=float(q["eta"]), kappa_s=float(q["kappa_s"])))
