"""Why a run took longer than its bound: each cause named with its figure (ratio over 1.5)."""
from __future__ import annotations

import csv
from pathlib import Path

RATIO_TO_EXPLAIN = 1.5


def pauses(queues_csv: Path) -> tuple[int, float]:
    """PFC pause frames sent during the run and the longest time one class was held, from queues.csv."""
    first: dict[tuple, int] = {}
    last: dict[tuple, tuple[int, float]] = {}
    try:
        with open(queues_csv) as f:
            for row in csv.DictReader(f):
                key = (row["node"], row["port"], row["tc"])
                first.setdefault(key, int(row["pfc_tx"]))
                last[key] = (int(row["pfc_tx"]), float(row["paused_s"]))
    except (OSError, KeyError, ValueError):
        return 0, 0.0
    frames = sum(v[0] - first[k] for k, v in last.items())
    return frames, max((v[1] for v in last.values()), default=0.0)


def explain(doc: dict, queues_csv: Path) -> dict | None:
    """The run's time against its bound and what the rest went to, or None when within 1.5x."""
    rs = [r for r in doc["results"]]
    if not rs:
        return None
    time_s, bound = sum(r["time_s"] for r in rs), sum(r["ideal_s"] for r in rs)
    if not bound or time_s / bound <= RATIO_TO_EXPLAIN:
        return None
    parts = {k: sum(r["bound"][k] for r in rs) for k in ("bandwidth_s", "alpha_s", "propagation_s")}
    causes = []
    if parts["propagation_s"] > 0:
        causes.append(f"WAN latency: {parts['propagation_s']:.2f} s of the {bound:.2f} s bound is propagation "
                      f"along the longest chain of dependent transfers ({parts['propagation_s'] / bound:.0%})")
    note = (doc.get("ring_placement") or {}).get("note")
    if note and "share" in note:
        causes.append("ECMP collision: " + note)
    frames, held = pauses(queues_csv)
    if frames:
        causes.append(f"pauses: {frames:,} PFC frames sent; the longest-held class waited {held:.2f} s")
    lost = doc.get("loss_ledger", {}).get("total", 0)
    if lost:
        causes.append(f"loss: {lost} packets dropped (loss ledger)")
    rest = time_s - bound
    sent = sum(p["bytes_sent"] for r in rs for p in r["per_rank"].values())
    ranks = max(1, len(doc.get("ranks", [])))
    causes.append(f"the CPU ceiling of this machine: the other {rest:.2f} s ({rest / time_s:.0%} of the run) "
                  f"is time the fabric model does not account for; the agents moved {sent * 8 / time_s / ranks / 1e6:.1f} "
                  f"Mbit/s per rank on average (lab rates), and on a loaded 2-core machine their packet rate, "
                  "not the links, sets the pace")
    return {"time_s": time_s, "bound_s": bound, "ratio": time_s / bound, "bound_parts": parts, "causes": causes}
