"""Two variants of the bundled lab up at once, a workload run on each in turn: what the benches
that compare two mechanisms share (bench/ecn_marking.py, bench/agent_placement.py).

Each variant is the lab built with one value of an environment variable. The runs interleave, so
whatever else the machine does falls on both alike, and the medians are printed with the ratio
of the first variant to the second.
"""
from __future__ import annotations

import csv
import os
import statistics
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def counters(queues_csv: Path) -> dict[str, int]:
    """CE marks and pause frames the run added over every port and class (first and last row)."""
    first, last = {}, {}
    with open(queues_csv) as f:
        for row in csv.DictReader(f):
            key = (row["node"], row["port"], row["tc"])
            first.setdefault(key, row)
            last[key] = row
    return {field: sum(int(last[k][field]) - int(first[k][field]) for k in last)
            for field in ("ecn_marked", "pfc_tx", "drops")}


def arguments(doc: str):
    """--runs and --workload, as every side-by-side bench takes them."""
    import argparse
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workload", default=str(ROOT / "workloads" / "incast.yml"))
    return ap.parse_args()


def measured_run(plan, lab, workload, out: Path) -> dict:
    """One run of the workload: its time and ratio to the α-β bound, what was wrong or lost, the
    agents' reaction as the run reports it, and the kernel's CE marks, pauses and drops."""
    from labctl.traffic.run import run_workload
    doc = run_workload(plan, lab, workload, out)
    (r,) = doc["results"]
    reaction = doc.get("controller_reaction") or {}
    row = {"time_s": r["time_s"], "ratio": r.get("ratio") or 0.0, "wrong": r["wrong"],
           "lost": doc["loss_ledger"]["total"], "lossless_drops": doc["loss_ledger"]["lossless_drops"],
           "reaction_worst_ms": 1e3 * (reaction.get("worst_s") or 0.0),
           "reaction_p99_ms": 1e3 * (reaction.get("p99_s") or 0.0), "reads": reaction.get("reads", 0)}
    row.update(counters(out / "queues.csv"))
    return row


def compare(env: str, variants: tuple[str, str], workload, runs: int, one_run, after_up=None,
            topology: Path = ROOT / "topologies" / "leaf-spine.yml") -> tuple[dict, dict]:
    """Build the lab once per variant (`env`=variant), then `runs` rounds of `one_run(plan, lab,
    workload, out)` on each in turn. Returns (variant -> rows, variant -> `after_up(lab, up_s)`)."""
    from labctl import backends, state
    from labctl import lifecycle as labmod
    os.environ.setdefault("LABCTL_STATE_DIR", tempfile.mkdtemp(prefix="labctl-bench-"))
    names = {v: f"lb{v[0]}{uuid.uuid4().hex[:5]}" for v in variants}
    plans, once = {}, {}
    try:
        for v in variants:
            os.environ[env] = v
            plans[v], lab, up_s = labmod.up(str(topology), (), names[v])
            once[v] = after_up(lab, up_s) if after_up else {}
        os.environ.pop(env)
        rows = {v: [] for v in variants}
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(runs):
                for v in variants:
                    row = one_run(plans[v], state.lab_dir(names[v]), workload, Path(tmp) / f"{v}{k}")
                    rows[v].append(row)
                    print(v, k, {f: round(x, 3) if isinstance(x, float) else x for f, x in row.items()}, flush=True)
        return rows, once
    finally:
        for name in names.values():
            if state.lab_dir(name).path.exists():
                backends.get("netns").destroy(state.lab_dir(name))


def print_medians(rows: dict, once: dict, variants: tuple[str, str], title: str) -> None:
    a, b = variants
    print(f"\n{title}")
    print(f"{'':22}{a:>14}{b:>14}{a + '/' + b:>16}")
    table = [(f, {v: statistics.median(r[f] for r in rows[v]) for v in variants}) for f in rows[a][0]]
    table += [(f, {v: once[v][f] for v in variants}) for f in once.get(a, {})]
    for f, med in table:
        ratio = f"{med[a] / med[b]:.2f}" if med[b] else "-"
        print(f"{f:22}{med[a]:14.3f}{med[b]:14.3f}{ratio:>16}")
