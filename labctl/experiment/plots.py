"""PNG plots of one run, from its own files (queues.csv, results.json). Each function returns the
series it drew, so tests can check that a plot shows the run's data and not something else."""
from __future__ import annotations

import csv
import json
from functools import lru_cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from labctl.kinds import fabric_kind
from labctl.plan.model import LabPlan  # noqa: E402

Series = dict[str, tuple[list[float], list[float]]]


def _rows(run_dir: Path) -> dict[tuple[str, str, str], list[dict]]:
    """A run's queue samples by (node, port, class). Every plot of a run reads them: they are parsed
    once (reading the CSV five times was a third of an experiment's drawing time). Read only."""
    f = run_dir / "queues.csv"
    st = f.stat()
    return _parsed_rows(str(f), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=1)
def _parsed_rows(path: str, mtime_ns: int, size: int) -> dict[tuple[str, str, str], list[dict]]:
    out: dict = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out.setdefault((row["node"], row["port"], row["class"]), []).append(row)
    return out


def _save(fig, ax, title: str, xlabel: str, ylabel: str, path: Path, legend: bool = True) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def queue_depth(run_dir: Path, plan: LabPlan, path: Path, top: int = 4) -> Series:
    """The deepest queues over time, with the ECN band (Kmin, Kmax) and the XOFF of lossless ones."""
    rows = _rows(run_dir)
    deepest = sorted(rows, key=lambda k: -max(int(r["depth_bytes"]) for r in rows[k]))[:top]
    series: Series = {}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for key in deepest:
        t = [float(r["t_s"]) for r in rows[key]]
        y = [int(r["depth_bytes"]) / 1e3 for r in rows[key]]
        label = f"{key[0]}→{key[1]} {key[2]}"
        series[label] = (t, y)
        ax.step(t, y, where="post", label=label)
    ax.axhline(plan.ecn.kmin / 1e3, color="tab:green", ls="--", lw=1, label=f"Kmin {plan.ecn.kmin / 1e3:.0f} KB")
    ax.axhline(plan.ecn.kmax / 1e3, color="tab:orange", ls="--", lw=1, label=f"Kmax {plan.ecn.kmax / 1e3:.0f} KB")
    xoffs = {c.xoff_bytes for n in plan.nodes for i in n.interfaces for c in i.shaping.classes
             if c.lossless and (n.name, i.name, c.name) in deepest}
    for x in sorted(xoffs)[:2]:
        ax.axhline(x / 1e3, color="tab:red", ls=":", lw=1, label=f"XOFF {x / 1e3:.0f} KB")
    _save(fig, ax, "Queue depth (deepest queues)", "lab time (s)", "depth (KB)", path)
    return series


def _cumulative_at(rows: list[dict], column: str, times: list[float]) -> list[float]:
    out, k, value = [], 0, float(rows[0][column])
    for t in times:
        while k < len(rows) and float(rows[k]["t_s"]) <= t:
            value = float(rows[k][column])
            k += 1
        out.append(value)
    return out


def throughput(run_dir: Path, path: Path, top: int = 6, bin_s: float = 0.1) -> Series:
    """Mbit/s leaving the busiest ports, in bins of `bin_s` lab seconds (all classes summed)."""
    rows = _rows(run_dir)
    ports: dict[tuple[str, str], list] = {}
    for (node, port, _), rs in rows.items():
        ports.setdefault((node, port), []).append(rs)
    end = max(float(r["t_s"]) for rs in rows.values() for r in rs)
    times = [k * bin_s for k in range(int(end / bin_s) + 2)]
    moved = {p: sum(float(rs[-1]["sent_bytes"]) - float(rs[0]["sent_bytes"]) for rs in v) for p, v in ports.items()}
    series: Series = {}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for p in sorted(moved, key=lambda p: -moved[p])[:top]:
        total = [sum(x) for x in zip(*(_cumulative_at(rs, "sent_bytes", times) for rs in ports[p]))]
        rate = [(b - a) * 8 / bin_s / 1e6 for a, b in zip(total, total[1:])]
        label = f"{p[0]}→{p[1]}"
        series[label] = (times[1:], rate)
        ax.plot(times[1:], rate, label=label)
    _save(fig, ax, f"Throughput per port ({bin_s:g} s bins)", "lab time (s)", "Mbit/s (lab)", path)
    return series


def ecmp_balance(run_dir: Path, plan: LabPlan, path: Path) -> Series:
    """Bytes each leaf sent up each of its uplinks during the run: equal bars = balanced ECMP."""
    rows = _rows(run_dir)
    bars: dict[str, float] = {}
    for node in plan.nodes:
        if not node.forwarding or all(plan.node(i.peer_node).forwarding for i in node.interfaces):
            continue
        for i in node.interfaces:
            if plan.node(i.peer_node).forwarding and fabric_kind(plan.fabrics[i.fabric].kind).leaf_spine:
                sent = sum(float(rs[-1]["sent_bytes"]) - float(rs[0]["sent_bytes"])
                           for k, rs in rows.items() if k[0] == node.name and k[1] == i.name)
                bars[f"{node.name}→{i.name}"] = sent / 1e6
    fig, ax = plt.subplots(figsize=(max(6, len(bars) * 0.6), 4.5))
    names = list(bars)
    ax.bar(range(len(names)), [bars[n] for n in names], color="tab:blue")
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    _save(fig, ax, "ECMP balance: bytes per leaf uplink", "uplink", "MB sent", path, legend=False)
    return {"uplinks": (list(range(len(names))), [bars[n] for n in names])}


def pauses_and_marks(run_dir: Path, path: Path, bin_s: float = 0.1) -> Series:
    """PFC frames sent and packets marked CE per bin, over every port of the lab."""
    rows = _rows(run_dir)
    end = max(float(r["t_s"]) for rs in rows.values() for r in rs)
    times = [k * bin_s for k in range(int(end / bin_s) + 2)]
    series: Series = {}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for column, label in (("pfc_tx", "PFC frames sent"), ("ecn_marked", "CE marks")):
        total = [sum(x) for x in zip(*(_cumulative_at(rs, column, times) for rs in rows.values()))]
        per_bin = [b - a for a, b in zip(total, total[1:])]
        series[label] = (times[1:], per_bin)
        ax.plot(times[1:], per_bin, label=label)
    _save(fig, ax, f"Pauses and ECN marks ({bin_s:g} s bins)", "lab time (s)", "per bin", path)
    return series


def longest(results: list[dict]) -> int:
    """The operation that took longest: where a run's queues, drops and reactions are (a step's
    backward pass crossing the WAN, not its short forward all-gather)."""
    return max(range(len(results)), key=lambda k: results[k]["time_s"])


def timeline(run_dir: Path, path: Path, result: int | None = None) -> Series:
    """Per rank, when each of its sends ran in operation `result` (the longest by default): a Gantt
    of the collective's steps. A rank's gap is it waiting for a chunk from its neighbour."""
    doc = json.loads((run_dir / "results.json").read_text())
    r = doc["results"][longest(doc["results"]) if result is None else result]
    series: Series = {}
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(r["per_rank"]) + 1.5))
    for row, (rank, pr) in enumerate(sorted(r["per_rank"].items(), key=lambda kv: int(kv[0]))):
        spans = [(s[1], s[2] - s[1]) for s in pr["sends"]]
        series[f"rank {rank}"] = ([s[0] for s in spans], [s[1] for s in spans])
        ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=[f"C{k % 10}" for k in range(len(spans))])
    names = [f"{k} {doc['nodes'].get(k, '')}" for k in sorted(r["per_rank"], key=int)]
    ax.set_yticks(range(len(names)), names, fontsize=8)
    _save(fig, ax, f"Timeline of {r['label']} (each bar one send)", "lab time (s)", "rank", path, legend=False)
    return series


def sender_rates(run_dir: Path, path: Path, result: int | None = None, window: float = 0.5) -> Series:
    """Each sending rank's rate over time in operation `result` (the longest by default), from its
    sends' completion times: DCQCN cutting and recovering shows here."""
    doc = json.loads((run_dir / "results.json").read_text())
    r = doc["results"][longest(doc["results"]) if result is None else result]
    series: Series = {}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for rank, pr in sorted(r["per_rank"].items(), key=lambda kv: int(kv[0])):
        ends = sorted(s[2] for s in pr["sends"])
        if len(ends) < 4:
            continue
        chunk = pr["bytes_sent"] / len(ends)
        t, y = [], []
        x = window
        while x <= ends[-1] + 1e-9:
            n = sum(1 for e in ends if x - window < e <= x)
            t.append(x)
            y.append(n * chunk * 8 / window / 1e6)
            x += window / 2
        series[f"rank {rank}"] = (t, y)
        ax.plot(t, y, label=f"rank {rank} {doc['nodes'].get(rank, '')}")
    _save(fig, ax, f"Sender rates in {r['label']}, {window:g} s windows", "lab time (s)", "Mbit/s (lab)", path)
    return series


def fabric_load(run_dir: Path, plan: LabPlan, path: Path, bin_s: float = 0.1) -> Series:
    """Mbit/s each fabric's links carry over the run (every port's egress, both ends of each link),
    in bins of `bin_s` lab seconds: the sum of what results.json's fabric_bytes counts."""
    from labctl.traffic.fabricmap import FABRICS, FabricMap
    rows = _rows(run_dir)
    fabric_of = FabricMap(plan).port_fabrics()
    end = max(float(r["t_s"]) for rs in rows.values() for r in rs)
    times = [k * bin_s for k in range(int(end / bin_s) + 2)]
    totals = {f: [0.0] * len(times) for f in FABRICS}
    for (node, port, _), rs in rows.items():
        f = fabric_of.get((node, port))
        if f is not None:
            totals[f] = [a + b for a, b in zip(totals[f], _cumulative_at(rs, "sent_bytes", times))]
    series: Series = {}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for f in FABRICS:
        rate = [(b - a) * 8 / bin_s / 1e6 for a, b in zip(totals[f], totals[f][1:])]
        if any(rate):
            series[f] = (times[1:], rate)
            ax.plot(times[1:], rate, label=f)
    _save(fig, ax, f"Load per fabric ({bin_s:g} s bins)", "lab time (s)", "Mbit/s (lab), all links", path)
    return series


def summary(metrics: dict[str, dict], names: list[str], path: Path, lines: dict[str, float] | None = None) -> Series:
    """The experiment's figure: one panel per metric in `names`, a bar per run; `lines` draws a
    dashed reference in a metric's panel (an expectation's bound)."""
    runs = list(metrics)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 4.2), squeeze=False)
    series: Series = {}
    for ax, name in zip(axes[0], names):
        y = [float(metrics[r].get(name, 0.0)) for r in runs]
        series[name] = (list(range(len(runs))), y)
        ax.bar(range(len(runs)), y, color=["tab:blue" if "tol" in r else "tab:orange" for r in runs])
        ax.set_xticks(range(len(runs)), runs, rotation=60, ha="right", fontsize=7)
        if lines and name in lines:
            ax.axhline(lines[name], color="tab:red", ls="--", lw=1)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return series
