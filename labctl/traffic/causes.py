"""Why a run took longer than its bound: each cause named with its figure (ratio over 1.5)."""
from __future__ import annotations

import csv
from pathlib import Path

RATIO_TO_EXPLAIN = 1.5
UNEXPLAINED_SHARE = 0.1     # what the named causes leave over, below which the CPU is not blamed


def pauses(queues_csv: Path) -> tuple[int, float]:
    """PFC pause frames sent during the run and the longest time one class was held during it, from
    queues.csv (its counters are the lab's since `up`: the run's share is last minus first)."""
    first: dict[tuple, tuple[int, float]] = {}
    last: dict[tuple, tuple[int, float]] = {}
    try:
        with open(queues_csv) as f:
            for row in csv.DictReader(f):
                key = (row["node"], row["port"], row["tc"])
                now = (int(row["pfc_tx"]), float(row["paused_s"]))
                first.setdefault(key, now)
                last[key] = now
    except (OSError, KeyError, ValueError):
        return 0, 0.0
    frames = sum(v[0] - first[k][0] for k, v in last.items())
    return frames, max((v[1] - first[k][1] for k, v in last.items()), default=0.0)


def explain(doc: dict, queues_csv: Path) -> dict | None:
    """The run's time against its bound and what the rest went to, or None when within 1.5x."""
    rs = [r for r in doc["results"]]
    if not rs:
        return None
    time_s, bound = sum(r["time_s"] for r in rs), sum(r["ideal_s"] for r in rs)
    if not bound or time_s / bound <= RATIO_TO_EXPLAIN:
        return None
    parts = {k: sum(r["bound"].get(k, 0.0) for r in rs) for k in ("bandwidth_s", "alpha_s", "propagation_s", "serial_s")}
    causes = []
    worth = max(0.005, 0.01 * bound)       # a part of the bound worth a line: not "0.00 s (0%)"
    if parts["propagation_s"] >= worth:
        causes.append(f"WAN latency: {parts['propagation_s']:.2f} s of the {bound:.2f} s bound is propagation that "
                      f"sending cannot hide ({parts['propagation_s'] / bound:.0%}): before a port's first data "
                      f"arrives, after its last, and along chains of transfers that wait for one another")
    if parts["serial_s"] >= worth:
        causes.append(f"waits in series: {parts['serial_s']:.2f} s of the bound ({parts['serial_s'] / bound:.0%}) is "
                      f"transfers that wait for one another: a chain longer than the busiest port's bytes, or that "
                      f"port waiting for its first data and the pipeline draining after its last")
    placed = doc.get("ring_placement") or {}
    stretched = 0.0
    if placed.get("note"):          # there is a note only where ECMP put ring hops on one link
        from labctl.traffic.placement import busiest
        worst = busiest(placed.get("hops") or [])
        # a ring runs at its busiest link's pace: its bandwidth time stretches by what that link is asked
        stretched = min((worst - 1) * parts["bandwidth_s"], time_s - bound)
        causes.append(f"ECMP collision, about {stretched:.2f} s ({stretched / time_s:.0%} of the run): "
                      + placed["note"])
    link = doc.get("busiest_uplink")
    if not stretched and link and link["seconds"] > bound:
        # no ring collision named, yet one fabric port was asked more than the bound allows (QPs
        # hashed onto one uplink, a port slowed by `tc set --rate`): the run could not end sooner
        from labctl.units import format_rate
        stretched = min(link["seconds"] - bound, time_s - bound)
        causes.append(f"busiest fabric link: {link['port']} carried {link['bytes'] / 1e6:.1f} MB of the measured "
                      f"operations, {link['seconds']:.2f} s at its {format_rate(link['rate_bps'])}: about "
                      f"{stretched:.2f} s ({stretched / time_s:.0%} of the run) past the bound, which counts the "
                      "GPUs' own ports (`labctl route` shows which flows share it)")
    frames, held = pauses(queues_csv)
    if frames:
        causes.append(f"pauses: {frames:,} PFC frames sent; the longest-held class waited {held:.2f} s")
    sent = sum(p["bytes_sent"] for r in rs for p in r["per_rank"].values())
    lost = doc.get("loss_ledger", {}).get("total", 0)
    r = doc.get("reordering") or {}
    # the agents count resent frames whole: their payload is what crosses the ports again in the
    # bound's unit (each frame's Ethernet, IP, UDP, BTH and ICRC are in the rate, not the bytes)
    from labctl.traffic.roce import FRAME_OVERHEAD
    resent = max(0, r.get("retransmitted_bytes", 0) - r.get("retransmitted_packets", 0) * FRAME_OVERHEAD)
    resending = 0.0
    if lost or resent:
        text = f"loss: {lost} packets dropped (loss ledger)"
        if resent and sent:
            # resent bytes cross the same ports again: the bandwidth time grows by their share of the
            # schedule's bytes (go-back-N's waits for its timer come on top, in what is left)
            resending = max(0.0, min(parts["bandwidth_s"] * resent / sent, time_s - bound - stretched))
            text += (f"; go-back-N resent {resent:,} payload bytes over the whole run, warm-up included "
                     f"({resent / sent:.0%} on top of the {sent:,} its measured operations send), about "
                     f"{resending:.2f} s at the ports' rate ({resending / time_s:.0%} of the run)")
        causes.append(text)
    rest = time_s - bound - stretched - resending
    timed = [r for r in rs if r.get("timed_out")]
    if timed:
        # an operation that did not finish counts until its agents gave up: waiting, not the CPU
        waited = max(0.0, min(rest, sum(max(0.0, r["time_s"] - r["ideal_s"]) for r in timed)))
        causes.append(f"timed out: {len(timed)} of {len(rs)} operations did not finish; they count the time until "
                      f"their agents gave up waiting for what never came, about {waited:.2f} s beyond their bound")
        rest -= waited
    if rest > UNEXPLAINED_SHARE * time_s:
        ranks = max(1, len(doc.get("ranks", [])))
        causes.append(f"the CPU ceiling of this machine: the other {rest:.2f} s ({rest / time_s:.0%} of the run) "
                      f"is time the fabric model does not account for; the agents moved "
                      f"{sent * 8 / time_s / ranks / 1e6:.1f} Mbit/s per rank on average (lab rates), and on a "
                      "loaded 2-core machine their packet rate, not the links, sets the pace")
    return {"time_s": time_s, "bound_s": bound, "ratio": time_s / bound, "bound_parts": parts, "causes": causes}
