"""A lab and its runs as the model sees them: the lab's fabric, at its lab rates, and each measured
collective with what the model needs to predict it (the phases, and the spines the kernel chose).

Only two-tier leaf-spine labs are modelled (every leaf cabled once to every spine): the bundled
leaf-spine template and labs like it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from labctl.errors import InputError, LabError, Where
from labctl.estimate import collectives
from labctl.estimate.fabric import Clos
from labctl.estimate.model import PhaseFeatures, phase_features
from labctl.kinds import node_kind
from labctl.plan.model import LabPlan

DEFAULT_SEEDS = list(range(1, 65))


def fabric_from_plan(plan: LabPlan) -> tuple[Clos, list[str]]:
    """The lab's Clos at lab rates, and its spines' names (index = the model's spine number)."""
    byname = {n.name: n for n in plan.nodes}
    gpus = sorted((n for n in plan.nodes if node_kind(n.kind).holds_rank and n.rank is not None), key=lambda n: n.rank)
    if not gpus or [g.rank for g in gpus] != list(range(len(gpus))):
        raise LabError(f"lab {plan.lab!r}: the model needs GPU ranks 0..n-1", "estimate a leaf-spine lab")
    per_server: dict[str, int] = {}
    for g in gpus:
        per_server[g.server or g.name] = per_server.get(g.server or g.name, 0) + 1
    gps = max(per_server.values())
    if any(v != gps for v in per_server.values()) or any(
            gpus[r].server != gpus[r - r % gps].server for r in range(len(gpus))):
        raise LabError(f"lab {plan.lab!r}: servers must hold equal, consecutive ranks for the model",
                       "estimate a leaf-spine lab from templates/leaf-spine")

    def port(node, kind):
        return next((i for i in node.interfaces if i.fabric in plan.fabrics and plan.fabrics[i.fabric].kind == kind),
                    None)

    nics = [port(g, "scale-out") for g in gpus]
    if any(i is None for i in nics):
        raise LabError(f"lab {plan.lab!r}: every GPU needs a scale-out NIC for the model", "estimate a leaf-spine lab")
    leaves = sorted({i.peer_node for i in nics})
    hosts = {n.name for n in plan.nodes if not n.forwarding}
    spines = sorted(n.name for n in plan.nodes if n.forwarding and n.name not in leaves
                    and not any(i.peer_node in hosts for i in n.interfaces))
    uplinks = [i for leaf in leaves for i in byname[leaf].interfaces if i.peer_node in spines]
    if not spines or len(uplinks) != len(leaves) * len(spines) or \
            any(sorted(i.peer_node for i in byname[leaf].interfaces if i.peer_node in spines) != spines for leaf in leaves):
        raise LabError(f"lab {plan.lab!r} is not a two-tier leaf-spine with every leaf cabled once to every spine",
                       "the model covers leaf-spine labs (templates/leaf-spine)")
    nvl = [port(g, "scale-up") for g in gpus]
    leaf_of = np.array([leaves.index(i.peer_node) for i in nics])
    return Clos(len(gpus), gps, leaf_of, len(leaves), len(spines), 1, 0, float(nics[0].shaping.rate_bps),
                float(min(i.shaping.rate_bps for i in uplinks)), 0.0,
                float(nvl[0].shaping.rate_bps) if nvl[0] is not None else 0.0), spines


def run_order(doc: dict, collective: str, plan: LabPlan) -> np.ndarray:
    """The ranks in the order the run put them in its rings (hier: grouped by server, as run.py does)."""
    ranks = [int(r) for r in doc["ranks"]]
    if collective != "hier_all_reduce":
        return np.array(ranks)
    server = {n.rank: n.server or n.name for n in plan.nodes if n.rank is not None}
    groups: dict[str, list[int]] = {}
    for r in ranks:
        groups.setdefault(server[r], []).append(r)
    return np.array([r for g in groups.values() for r in g])


def samples(run_dir: Path, seeds: list[int] = DEFAULT_SEEDS) -> list[dict]:
    """One sample per collective and size of a run: measured lab time, the lab's own α-β bound, and
    the model's phase features (with the kernel's recorded spines when the run traced them)."""
    run_dir = Path(run_dir)
    from labctl.topology.yamlpos import read_input
    # a run directory may be anyone's: each file is read only if it is a regular file of bounded size
    # (a link to /dev/zero would be read until memory ran out), and what does not parse is an error
    files = {}
    for name in ("results.json", "plan.json"):
        if not (run_dir / name).exists():
            raise InputError(Where(str(run_dir)), f"not a run directory: {name} is missing",
                             "give a directory `labctl run` wrote (it holds results.json and plan.json)")
        files[name] = read_input(run_dir / name, name, f"{run_dir}/{name} as `labctl run` wrote it")
    try:
        doc = json.loads(files["results.json"])
        plan = LabPlan.from_dict(json.loads(files["plan.json"]))
        _ = doc["ranks"], doc["results"]          # the keys a sample reads, there before any is made
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(Where(str(run_dir)), f"results.json and plan.json there are not what `labctl run` writes "
                         f"({type(exc).__name__}: {str(exc)[:80]})", "give a directory `labctl run` wrote") from None
    fabric, spine_names = fabric_from_plan(plan)
    opts = doc.get("options", {})
    qps, fixed = int(opts.get("qps", 1)), opts.get("sport") == "fixed"
    if opts.get("channels", 1) != 1:
        raise LabError(f"{run_dir}: runs with channels > 1 are not modelled", "run with channels: 1")
    recorded = {(p["src"], p["dst"], p["qp"]): spine_names.index(p["spine"]) for p in doc.get("fabric_paths", [])}
    by_size: dict[tuple[str, int], list[dict]] = {}
    for r in doc["results"]:
        if r["collective"] in collectives.COLLECTIVES:
            by_size.setdefault((r["collective"], r["size"]), []).append(r)
    out = []
    for (coll, size), rows in by_size.items():
        order = run_order(doc, coll, plan)
        feats = []
        for ph in collectives.phases(coll, order, size, fabric.gpus_per_server):
            spines = _recorded(recorded, ph, qps if not fixed else 1, fabric)
            feats.append(phase_features(fabric, ph, seeds, qps, "same", spines, fixed, len(order)))
        out.append({"run": run_dir.name, "workload": doc["workload"], "collective": coll, "size": size,
                    "ranks": len(order), "qps": qps, "sport": opts.get("sport", "per-qp"), "dilation": doc["dilation"],
                    "measured_s": float(np.mean([r["time_s"] for r in rows])), "lab_ideal_s": rows[0]["ideal_s"],
                    "placement": "recorded" if spines is not None else "hash model", "phases": [f.to_dict() for f in feats]})
    return out


def _recorded(recorded: dict, ph, qps: int, fabric: Clos) -> list[np.ndarray] | None:
    """Per QP, the recorded spine of each hop that crosses the fabric (0 for hops that do not)."""
    out = []
    for k in range(qps):
        col = np.zeros(len(ph.src), dtype=np.int64)
        for i, (a, b) in enumerate(zip(ph.src.tolist(), ph.dst.tolist())):
            crosses = fabric.leaf_of[a] != fabric.leaf_of[b] and not (
                a // fabric.gpus_per_server == b // fabric.gpus_per_server and fabric.nvlink_bps)
            if crosses:
                if (a, b, k) not in recorded:
                    return None
                col[i] = recorded[(a, b, k)]
        out.append(col)
    return out


def features(sample: dict) -> list[PhaseFeatures]:
    return [PhaseFeatures(**f) for f in sample["phases"]]
