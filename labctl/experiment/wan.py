"""What a run did at the DCI routers' WAN ports: their queue's depth over time (a plot), its peak
and drops, and the PFC pauses inside the zones (every other port), from the run's queues.csv."""
from __future__ import annotations

from pathlib import Path

from labctl.experiment import plots
from labctl.plan.model import LabPlan


def wan_ports(plan: LabPlan) -> set[tuple[str, str]]:
    """(node, port) of every port whose link is carried by the WAN line."""
    wired = {lk.id for lk in plan.links if lk.wire is not None}
    return {(n.name, i.name) for n in plan.nodes for i in n.interfaces if i.link in wired}


def wan_metrics(plan: LabPlan, deltas: dict) -> dict[str, float]:
    """From queue_deltas: the deepest WAN egress queue (any class), the WAN queues' drops, and the
    PFC frames sent by the ports that are not on the WAN (the zones' own fabrics)."""
    ports = wan_ports(plan)
    on_wan = {k: d for k, d in deltas.items() if (k[0], k[1]) in ports}
    return {
        "wan_max_depth": max([d["max_depth"] for d in on_wan.values()] or [0]),
        "wan_drops": sum(d["drops"] for d in on_wan.values()),
        "zone_pfc_tx": sum(d["pfc_tx"] for k, d in deltas.items() if k not in on_wan),
    }


def unfilled_queues(metrics: dict[str, dict], sweep_var: str | None) -> dict[str, str]:
    """In a sweep over a buffer (wan_buffer, ...), a note for each run whose WAN queue never
    filled: its peak under a quarter of the deepest among the runs of the same step (nocc@2MB,
    nocc@bdp, ...) and no WAN drop. Its senders stayed under the WAN's rate (their own pace, or
    congestion control), so the run did not test the WAN's buffer, whatever its size; a sweep over
    buffers reads wrong without saying so. Elsewhere (a sweep over TE modes or distances) a shallow
    queue is the answer, not a caveat."""
    if not sweep_var or "buffer" not in sweep_var:
        return {}
    steps: dict[str, dict[str, float]] = {}
    for name, m in metrics.items():
        if "wan_max_depth" in m and m.get("wan_port_bytes", 1) > 0:      # a run with no WAN traffic: no note
            steps.setdefault(name.split("@")[0], {})[name] = m["wan_max_depth"]
    out = {}
    for depths in steps.values():
        top = max(depths, key=depths.get)
        for name, depth in depths.items():
            if depth < depths[top] / 4 and not metrics[name].get("wan_drops"):
                out[name] = (f"its WAN queue peaked at {_size(depth)}, under a quarter of {top}'s "
                             f"{_size(depths[top])}, and dropped nothing: the burst did not form, "
                             "so this run did not test the WAN's buffer")
    return out


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.1f} kB"


def path_metrics(plan: LabPlan, before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> dict:
    """From the WAN links' port counters over a run (fabricports.link_sent_bytes before and after):
    the share of the WAN's bytes that took a path longer than the shortest (`wan_long_share`),
    the bytes on the shortest and on longer paths, and the model's floor for the run's WAN part (`wan_bound_s`): on each
    path that carried bytes, the busier direction's bytes at the path's lab rate plus its lab
    one-way delay (the last byte leaves after all the others and still has the fibre to cross),
    the slowest path's. A step's collectives cannot take less than their WAN transfers (the ops'
    times add up, each with its own bytes and at least one crossing); TE lowers the floor by
    moving bytes off a long or slow path."""
    links = {lk.id: lk for lk in plan.links if lk.id in after}
    sent = {i: (after[i][0] - before.get(i, (0, 0))[0], after[i][1] - before.get(i, (0, 0))[1]) for i in links}
    total = sum(a + b for a, b in sent.values())
    shortest = min((lk.lab_delay_ns for lk in links.values() if lk.wire), default=0)
    longer = sum(a + b for i, (a, b) in sent.items() if links[i].lab_delay_ns > shortest)
    floor = max([max(a, b) * 8 / links[i].lab_rate_bps + links[i].lab_delay_ns / 1e9
                 for i, (a, b) in sent.items() if links[i].wire and max(a, b) > 0] or [0.0])
    return {"wan_long_share": longer / total if total else 0.0, "wan_bound_s": floor,
            "wan_short_bytes": float(total - longer), "wan_long_bytes": float(longer)}


def wan_queue_plot(run_dir: Path, plan: LabPlan, path: Path) -> plots.Series:
    """Depth over time of each busy WAN egress queue, with its buffer (where it drops) and Kmin."""
    rows = plots._rows(run_dir)
    ports = wan_ports(plan)
    series: plots.Series = {}
    fig, ax = plots.plt.subplots(figsize=(9, 4.5))
    buffers = set()
    for key, rs in sorted(rows.items()):
        if (key[0], key[1]) not in ports or max(int(r["depth_bytes"]) for r in rs) == 0:
            continue
        t = [float(r["t_s"]) for r in rs]
        y = [int(r["depth_bytes"]) / 1e6 for r in rs]
        label = f"{key[0]}→{key[1]} {key[2]}"
        series[label] = (t, y)
        ax.step(t, y, where="post", label=label)
        iface = plan.node(key[0]).iface(key[1])
        buffers |= {c.buffer_bytes for c in iface.shaping.classes if c.name == key[2]}
    for b in sorted(buffers):
        ax.axhline(b / 1e6, color="tab:red", ls=":", lw=1, label=f"buffer {b / 1e6:.1f} MB")
    plots._save(fig, ax, "DCI queue toward the WAN", "lab time (s)", "depth (MB)", path)
    return series
