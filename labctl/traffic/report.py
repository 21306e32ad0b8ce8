"""The terminal table, in nccl-tests' format, with the α-β ideal, in lab and real-fabric time."""
from __future__ import annotations

from statistics import mean

LATE_START_NOTED_S = 0.001    # an agent that began its operation later than this is named


def summarize(results: list[dict]) -> list[dict]:
    """One row per (label), averaged over iterations, as nccl-tests averages its iterations."""
    rows: dict[str, list[dict]] = {}
    for r in results:
        rows.setdefault(r["label"], []).append(r)
    out = []
    for label, rs in rows.items():
        first = rs[0]
        out.append({"label": label, "collective": first["collective"], "size": first["size"], "n": first["n"],
                    "time_s": mean(r["time_s"] for r in rs), "algbw_GBps": mean(r["algbw_GBps"] for r in rs),
                    "busbw_GBps": mean(r["busbw_GBps"] for r in rs), "ideal_s": first["ideal_s"],
                    "wrong": sum(r["wrong"] for r in rs), "dilation_time": None,
                    "real_time_s": mean(r["real"]["time_s"] for r in rs),
                    "real_algbw": mean(r["real"]["algbw_GBps"] for r in rs),
                    "real_busbw": mean(r["real"]["busbw_GBps"] for r in rs)})
    return out


def reordering(counters: dict, options: dict, network_lost: int = 0) -> dict:
    """What reordering did in a run, from the agents' counters: the share of data packets that
    arrived after a later one of their QP (first transmissions: traffic/receiver.py), what the
    receivers did about it (`ooo`, reliable runs), the NAKs they sent and what was resent.
    `network_lost` is what the loss ledger counted lost on the way: in a reliable run each such
    packet comes again as a resend that a receiver never saw, behind the later ones it did see,
    which it cannot tell from a reordered packet (a single-path WAN that dropped 981 read 981
    reordered). They are taken off (the share then errs a little low, never high)."""
    rx = [q for c in counters.values() for q in c.get("rx", [])]
    tx = [q for c in counters.values() for q in c.get("tx", [])]
    resent = sum(q.get("retransmitted", 0) for q in tx)
    # first transmissions: what arrived less the resends (a resend that was lost again is not in
    # the arrivals, and the share then errs a little low, never high)
    packets = max(0, sum(q["packets"] for q in rx) - resent)
    behind = sum(q["reordered"] for q in rx)
    lost_then_resent = min(behind, network_lost, resent) if options.get("reliable") else 0
    reordered = behind - lost_then_resent
    return {"receivers": (options.get("ooo", "drop") if options.get("reliable") else "unreliable"),
            "data_packets": packets, "reordered": reordered, "resends_of_lost": lost_then_resent,
            "reordered_share": reordered / packets if packets else 0.0,
            "placed_early": sum(q.get("early", 0) for q in rx), "dropped": sum(q.get("dropped", 0) for q in rx),
            "naks": sum(q.get("naks_sent", 0) for q in rx),
            "retransmitted_packets": resent,
            "retransmitted_bytes": sum(q.get("retransmitted_bytes", 0) for q in tx)}


def reordering_line(r: dict) -> str:
    what = {"drop": "go-back-N receivers (ooo: drop)", "tolerate": "receivers that place out of order (ooo: tolerate)",
            "unreliable": "unreliable receivers (nothing resent)"}[r["receivers"]]
    lost = (f", not counting {r['resends_of_lost']:,} resends of packets the network lost"
            if r.get("resends_of_lost") else "")
    return (f"# reordering: {r['reordered_share']:.2%} of {r['data_packets']:,} data packets (first transmissions) "
            f"arrived after a later one ({r['reordered']:,}{lost}); {what}: {r['naks']:,} NAKs, "
            f"{r['retransmitted_packets']:,} packets ({r['retransmitted_bytes']:,} bytes) resent")


REDUCING = ("all_reduce", "reduce_scatter", "reduce", "hier_all_reduce")   # nccl-tests prints their redop, sum


def table(doc: dict) -> str:
    # a train: step is a schedule of many collectives, not one of nccl-tests' rows: it gets lines of its own
    rows = [r for r in summarize(doc["results"]) if r["collective"] != "train_step"]
    d = doc["dilation"]
    lines = [f"# labctl run {doc['workload']} on lab {doc['lab']}: {len(doc['ranks'])} ranks, dilation {d:g}"]
    if not rows and "train" not in doc:
        from labctl.traffic.fabricmap import table as fabric_table
        return "\n".join(lines + flow_lines(doc.get("flows", [])) + fabric_table(doc))
    lines += [] if not rows else ["#  lab time (what the namespaces measured)                                      "
              "| real-fabric equivalent (lab time / dilation)",
              f"# {'size':>11} {'count':>11} {'type':>6} {'redop':>6} {'root':>5} {'time':>11} {'algbw':>7} "
              f"{'busbw':>7} {'#wrong':>6} {'ideal':>11} {'ratio':>6} | {'time':>9} {'algbw':>8} {'busbw':>8}",
              f"# {'(B)':>11} {'(elements)':>11} {'':>6} {'':>6} {'':>5} {'(us)':>11} {'(GB/s)':>7} "
              f"{'(GB/s)':>7} {'':>6} {'(us)':>11} {'':>6} | {'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8}"]
    for r in rows:
        root = 0 if r["collective"] in ("broadcast", "incast") else -1
        # an FSDP stage is several collectives at once: nccl-tests has no row for it, so it shows its
        # label and no bus bandwidth (no one bus factor holds for a mix of groups and kinds)
        stage = r["collective"] == "fsdp_stage"
        redop = "-" if stage else "sum" if r["collective"] in REDUCING else "none"
        busbw, real_busbw = ("-", "-") if stage else (f"{r['busbw_GBps']:.3f}", f"{r['real_busbw']:.2f}")
        lines.append(
            f"  {r['size']:>11} {r['size'] // 4:>11} {'-' if stage else 'float':>6} {redop:>6} {root:>5} "
            f"{r['time_s'] * 1e6:>11.0f} {r['algbw_GBps']:>7.3f} {busbw:>7} {r['wrong']:>6} {r['ideal_s'] * 1e6:>11.0f} "
            f"{r['time_s'] / r['ideal_s'] if r['ideal_s'] else 0:>6.2f} | {r['real_time_s'] * 1e6:>9.1f} "
            f"{r['real_algbw']:>8.2f} {real_busbw:>8}" + (f"  {r['label']}" if stage else ""))
    collectives = [r for r in rows if r["collective"] != "fsdp_stage"]
    if collectives:
        avg = mean(r["busbw_GBps"] for r in collectives)
        lines.append(f"# Avg bus bandwidth (lab): {avg:.4f} GB/s   (real fabric: {avg * d:.2f} GB/s)")
    if "fsdp" in doc:
        f = doc["fsdp"]
        sent = list(f["bytes_per_rank"].values())
        lines.append(f"# FSDP {f['strategy']} step: {f['step_time_s']:.3f} s lab ({f['step_time_s'] / d * 1e3:.2f} ms "
                     f"real), ideal {f['step_ideal_s']:.3f} s; bytes per rank {min(sent):.0f}..{max(sent):.0f}, "
                     f"{f.get('expected_formula', '3(n-1)/n x model')} = "
                     f"{f.get('expected_bytes_per_rank', f['expected_full_shard_bytes_per_rank']):.0f}")
    if "train" in doc:
        lines += steps_line([r for r in doc["results"] if r["collective"] == "train_step"]) + \
            train_lines(doc["train"], d)
    lost = [(r, q) for r, c in doc.get("counters", {}).items() for q in c.get("rx", []) if q["gaps"] or q["late"]]
    total_gaps = sum(q["gaps"] for _, q in lost)
    ce = sum(q["ce"] for c in doc.get("counters", {}).values() for q in c.get("rx", []))
    if doc.get("ranks"):
        reordered = sum(q["reordered"] for c in doc.get("counters", {}).values() for q in c.get("rx", []))
        lines.append(f"# receivers: {total_gaps} packets lost (PSN gaps), "
                     f"{sum(q['late'] for _, q in lost)} duplicates, {reordered} reordered, {ce} ECN-CE marks")
    if doc.get("reordering"):
        lines.append(reordering_line(doc["reordering"]))
    late = [r for r in doc.get("results", []) if r.get("late_start_s", 0.0) > LATE_START_NOTED_S]
    if late:
        worst = max(r["late_start_s"] for r in late)
        lines.append(f"# {len(late)} of {len(doc['results'])} operations began late on some agent (worst "
                     f"{worst * 1e3:.1f} ms after the common start, counted in their time): the machine was busy")
    if "loss_ledger" in doc:
        from labctl.telemetry.ledger import summary
        lines.append("# " + summary(doc["loss_ledger"]))
    for note in ((doc.get("ring_placement") or {}).get("note"), doc.get("trace_error")):
        if note:
            lines.append("# " + note)
    if doc.get("controller_reaction", {}).get("reads"):
        from labctl.telemetry.reaction import describe
        lines.append("# " + describe(doc["controller_reaction"]))
    if doc.get("changed_during_run"):
        changed = doc["changed_during_run"]
        lines.append(f"# changed while the run played (labctl lb, tc set; plan.json is the lab as it began): "
                     f"{'; '.join(changed[:6])}{f'; and {len(changed) - 6} more' if len(changed) > 6 else ''}")
    lines += flow_lines(doc.get("flows", []))
    from labctl.traffic.fabricmap import table as fabric_table
    lines += fabric_table(doc)
    slow = doc.get("slow_run")
    if slow:
        lines.append(f"# {slow['ratio']:.1f}x the latency-aware bound ({slow['time_s']:.2f} s against "
                     f"{slow['bound_s']:.2f} s): where the rest went")
        lines += [f"#  - {c}" for c in slow["causes"]]
    return "\n".join(lines)


def steps_line(steps: list[dict]) -> list[str]:
    """The measured steps (warm-up left out), as nccl-tests averages its iterations."""
    if not steps:
        return []
    t = mean(r["time_s"] for r in steps)
    ideal = steps[0]["ideal_s"]
    return [f"# {len(steps)} train step{'s' if len(steps) > 1 else ''} measured: {t:.3f} s lab on average "
            f"({min(r['time_s'] for r in steps):.3f}-{max(r['time_s'] for r in steps):.3f}), bound {ideal:.3f} s, ratio "
            f"{t / ideal if ideal else 0:.2f}, {sum(r['wrong'] for r in steps)} wrong"]


def train_lines(t: dict, dilation: float) -> list[str]:
    """A train: step: time against its bound, duty cycle, bubble, and bytes per dimension and fabric."""
    g = t["degrees"]
    wan = t["wan_hidden_fraction"]
    return [f"# train step tp={g['tp']} pp={g['pp']} dp={g['dp']} ep={g['ep']} placement {t['placement']}: "
            f"{t['step_time_s']:.3f} s lab ({t['step_time_s'] / dilation / t['scale'] * 1e3:.1f} ms at full size: "
            f"bytes and compute are x{t['scale']:g}, the WAN's latency is not), bound "
            f"{t['ideal_s']:.3f} s (compute path {t['compute_path_s']:.3f} s), bubble {t['bubble_fraction']:.0%}, "
            f"duty cycle {t['duty_cycle']:.0%} per GPU" + (f", {wan:.0%} of the WAN's busy time behind compute"
                                                             if wan is not None else ""),
            "# bytes per dimension: " + ", ".join(f"{k} {v:,}" for k, v in t["dim_bytes"].items()),
            "# bytes per fabric (schedule): " + ", ".join(f"{k} {v:,}" for k, v in t["fabric_bytes_expected"].items())] \
        + dimension_lines(t.get("dim_fabric_bytes") or {}, t.get("lab_fabrics"))


# the fabrics each dimension is meant for: tp exchanges every layer's activations in the critical
# path, so Megatron keeps it inside an NVLink domain; ep's all-to-alls span NVLink and the
# scale-out fabric but not a WAN; pp and dp may cross buildings (which one should is
# experiments/parallelism-placement.yml's question)
MEANT_FOR = {"tp": ("scaleup",), "ep": ("scaleup", "scaleout"), "pp": ("scaleup", "scaleout", "scaleacross"),
             "dp": ("scaleup", "scaleout", "scaleacross")}


def dimension_lines(by_dim: dict[str, dict[str, int]], lab_fabrics: list[str] | None = None) -> list[str]:
    """Where each dimension's bytes went (the fabric of each transfer's path), and a note for a
    dimension on a fabric it is not meant for (tp off NVLink, anything but dp across the WAN): put
    there by the placement, or by a lab that has none of the fabrics it is meant for."""
    landed = {d: f for d, f in by_dim.items() if f}
    if not landed:
        return []
    out = ["# where each dimension went: " + "; ".join(
        f"{d} " + ", ".join(f"{f} {n:,}" for f, n in fs.items()) for d, fs in landed.items())]
    for d, fs in landed.items():
        off = {f: n for f, n in fs.items() if f not in MEANT_FOR.get(d, fs)}
        if off:
            share = sum(off.values()) / sum(fs.values())
            meant = MEANT_FOR[d]
            why = (f"this lab has no {' or '.join(meant)} fabric, so no placement can keep it there (a lab with "
                   "NVLink domains: the leaf-spine template's scale_up)"
                   if lab_fabrics is not None and not set(meant) & set(lab_fabrics) else
                   "the placement put it there (`placement:` in train:, docs/parallelism.md)")
            out.append(f"# note: {share:.0%} of {d}'s bytes cross {' and '.join(off)}, a fabric {d} is not meant "
                       f"for ({d} on {', '.join(meant)}): {why}")
    return out


def flow_lines(flows: list[dict]) -> list[str]:
    """TCP flows grouped by flow: transfers, bytes, goodput (lab), retransmissions."""
    groups: dict[str, list[dict]] = {}
    for f in flows:
        groups.setdefault(f["flow"], []).append(f)
    out = []
    for name, fs in groups.items():
        done = [f for f in fs if f["received"] == f["size"]]
        moved = sum(f["received"] for f in fs)
        seconds = max(f["start_s"] + f["seconds"] for f in fs) - min(f["start_s"] for f in fs)
        out.append(f"# TCP {name}: {len(fs)} transfers ({len(done)} complete), {moved / 1e6:.1f} MB in {seconds:.2f} s "
                   f"lab = {moved * 8 / max(seconds, 1e-9) / 1e6:.1f} Mbit/s, {sum(f['retransmits'] for f in fs)} "
                   f"retransmissions{', errors: ' + fs[0]['error'] if any(f['error'] for f in fs) else ''}")
    return out
