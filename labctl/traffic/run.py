"""`labctl run WORKLOAD`: turn a workload into schedules, play them on the lab's agents, keep results."""
from __future__ import annotations

import dataclasses
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

from labctl import procs
from labctl.paths import new_run_dir  # noqa: F401  (where callers have always found it)
from labctl.telemetry.stallwatch import StallWatch
from labctl.telemetry import agentreport, reaction
from labctl.errors import InputError, Where
from labctl.plan.model import LabPlan
from labctl.state import LabDir
from labctl.telemetry import fabricports, ledger, linkbytes
from labctl.telemetry.sampler import QueueSampler
from labctl.traffic import algorithms, causes, changes, fabricmap, flows, fsdp, placement, report, schedule as sch, train_run
from labctl.traffic.dcqcn import Params
from labctl.traffic.tcpflow import FlowRun
from labctl.traffic.bound import bound_parts, chain_seconds
from labctl.traffic.pool import (ID_MASK, AgentPool, RunOptions, gpu_ranks,
                                 local_index, quiet_floor)
from labctl.traffic.workload import MAX_OPS, LoadedWorkload


@dataclass
class Op:
    label: str
    collective: str
    size: int
    schedule: sch.Schedule
    iteration: int
    warmup: bool
    stage: int | None = None
    compute_s: float = 0.0       # a train step's compute critical path, part of its bound


def participants(plan: LabPlan, loaded: LoadedWorkload) -> list[int]:
    w = loaded.workload
    nodes = gpu_ranks(plan)
    where = Where(str(loaded.file), key="participants")
    if w.participants == "all":
        ranks = list(nodes)
    elif isinstance(w.participants, str) and w.participants.startswith("rail:"):
        try:
            rail = int(w.participants.split(":", 1)[1])
        except ValueError:
            raise InputError(where, f"{w.participants!r} is not rail:N", "write e.g. rail:0") from None
        ranks = [r for r, n in nodes.items() if local_index(plan, n) == rail]
    elif isinstance(w.participants, list):
        by_name = {n.name: r for r, n in nodes.items()}
        unknown = [p for p in w.participants if p not in by_name]
        if unknown:
            raise InputError(where, f"{unknown[0]!r} is not a GPU of lab {plan.lab!r}",
                             "list GPU node names (labctl status shows them)")
        ranks = [by_name[p] for p in w.participants]
    else:
        raise InputError(where, f"{w.participants!r} is not all, rail:N or a list of GPUs", None)
    if len(ranks) < 2:
        raise InputError(where, f"{len(ranks)} GPU(s) selected; a collective needs at least 2",
                         "select more GPUs")
    if w.root:
        root = next((r for r in ranks if nodes[r].name == w.root), None)
        if root is None:
            raise InputError(Where(str(loaded.file), key="root"), f"root {w.root!r} is not a participant", None)
        ranks.remove(root)
        ranks.insert(0, root)
    return ranks


def build_ops(plan: LabPlan, loaded: LoadedWorkload, ranks: list[int]) -> list[Op]:
    w, o = loaded.workload, loaded.workload.options
    ops: list[Op] = []
    if w.train:
        cfg = train_run.step_config(plan, loaded, ranks)
        s, compute_s = train_run.step_schedule(cfg, ranks, o.slice)
        return [Op(f"train step {it - w.warmup}", "train_step", s.size, s, it - w.warmup, it < w.warmup,
                   compute_s=compute_s) for it in range(w.warmup + w.iterations)]
    if w.fsdp:
        f = w.fsdp
        model = fsdp.model_from(f.model, f.layers, f.hidden, f.params_per_layer, f.dtype)
        group_size = f.group_size
        if f.group_by:
            ranks, group_size = _grouped(plan, ranks, f.group_by, loaded)
        stages = fsdp.fsdp_step(model, ranks, f.strategy, group_size, f.prefetch, f.scale)
        if len(stages) * (w.warmup + w.iterations) > MAX_OPS:
            raise InputError(loaded.smap.where(("iterations",)) if loaded.smap else Where(str(loaded.file), key="iterations"),
                             f"{len(stages)} stages a step x {w.warmup + w.iterations:,} steps is more than the "
                             f"{MAX_OPS:,} operations one workload plays", "fewer iterations")
        played = []          # one step's stages, scheduled once: every step plays the same schedules
        for stage in stages:
            ids = itertools.count()
            transfers = []
            for c in stage:
                for grp in c.groups:
                    transfers += sch.GENERATORS[c.collective](list(grp), c.size, o.slice, o.channels, ids).transfers
            size = sum(c.size for c in stage)
            played.append((" + ".join(c.label for c in stage), size, sch.Schedule("fsdp_stage", ranks, size, transfers)))
        return [Op(label, "fsdp_stage", size, s, it - w.warmup, it < w.warmup, k)
                for it in range(w.warmup + w.iterations) for k, (label, size, s) in enumerate(played)]
    for size in w.size_list():
        # one schedule a size, played by each of its iterations (schedules are never changed by playing)
        if w.collective == "hier_all_reduce" or w.algorithm != "ring":
            s = algorithms.schedule(plan, w.collective, w.algorithm, ranks, size, o.slice, o.channels, w.options.alpha)
        else:
            s = sch.GENERATORS[w.collective](ranks, size, o.slice, o.channels)
        if w.victim:
            s = _with_victim(plan, loaded, s)
        ops += [Op(f"{w.collective} {size}", w.collective, size, s, it - w.warmup, it < w.warmup)
                for it in range(w.warmup + w.iterations)]
    return ops


def largest_op(loaded: LoadedWorkload, n: int) -> int:
    """The transfers of a collective workload's largest operation over `n` ranks, estimated from
    above without building it: 2 passes x n ranks x (slices + n) x channels (a ring all-reduce makes
    2(n-1) n ceil(size/n/slice) per channel). 0 for FSDP and training steps, whose sizes a preset sets."""
    w = loaded.workload
    if not w.collective or w.sizes is None:
        return 0
    o = w.options
    return 2 * n * (-(-max(w.size_list(), default=0) // o.slice) + n) * o.channels


def victim_ranks(plan: LabPlan, loaded: LoadedWorkload) -> list[int]:
    v = loaded.workload.victim
    if v is None:
        return []
    by_name = {n.name: r for r, n in gpu_ranks(plan).items()}
    for name, key in ((v.from_, "victim.from"), (v.to, "victim.to")):
        if name not in by_name:
            raise InputError(Where(str(loaded.file), key=key), f"{name!r} is not a GPU of lab {plan.lab!r}",
                             "name a GPU (labctl status lists them)")
    return [by_name[v.from_], by_name[v.to]]


def _with_victim(plan: LabPlan, loaded: LoadedWorkload, s: sch.Schedule) -> sch.Schedule:
    """The schedule plus the victim's sendrecv, started at once and depending on nothing."""
    src, dst = victim_ranks(plan, loaded)
    ids = itertools.count(max((t.id for t in s.transfers), default=-1) + 1)
    extra = [dataclasses.replace(t, phase="victim")
             for t in sch.sendrecv([src, dst], loaded.workload.victim.size, ids=ids).transfers]
    ranks = s.ranks + [r for r in (src, dst) if r not in s.ranks]
    return sch.Schedule(s.collective, ranks, s.size, s.transfers + extra)


def _grouped(plan: LabPlan, ranks: list[int], by: str, loaded: LoadedWorkload) -> tuple[list[int], int]:
    """Ranks ordered group by group (zone or server) and the common group size, for HYBRID_SHARD."""
    nodes = gpu_ranks(plan)
    groups: dict[str, list[int]] = {}
    for r in ranks:
        key = nodes[r].zone if by == "zone" else nodes[r].server
        if key is None:
            raise InputError(Where(str(loaded.file), key="fsdp.group_by"),
                             f"GPU {nodes[r].name} has no {by}", f"use a lab whose GPUs have a {by}, or group_size:")
        groups.setdefault(key, []).append(r)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1:
        raise InputError(Where(str(loaded.file), key="fsdp.group_by"),
                         f"the {by}s hold different numbers of participants ({sorted(sizes)})",
                         "select the same number of GPUs in each")
    return [r for g in groups.values() for r in g], sizes.pop()


def dcqcn_params(o) -> Params:
    """The reaction point's parameters in real-fabric units; the agent pool applies the dilation.
    The notification point sends a QP at most one CNP per `cnp_interval`, and the reaction point
    cuts on each (as in DCQCN's paper). Its own guard against a burst of CNPs is half that interval:
    equal to it, a CNP that arrived a hair early (the two ends' clocks and queues jitter) was
    ignored, and the next came a whole interval later, so that half the cuts a congested queue asked
    for were lost at random and its peak moved from run to run (2.0 against 2.7 MB)."""
    return Params(rate_ai=o.dcqcn_rate_ai, rate_hai=o.dcqcn_rate_hai, g=o.dcqcn_g,
                  alpha_period=o.dcqcn_timer * 1e-9, increase_period=o.dcqcn_timer * 1e-9,
                  byte_counter=o.dcqcn_byte_counter, min_cut_interval=o.cnp_interval * 1e-9 / 2)




def prepare(plan: LabPlan, loaded: LoadedWorkload, build: bool = True) -> tuple[list[int], list[Op], list]:
    """Everything of a workload checked against the lab's plan, before a byte is sent or a file
    written: its ranks, its operations' schedules (not built if not `build`) and its TCP flows, or a
    located InputError."""
    w = loaded.workload
    collectives = w.collective is not None or w.fsdp is not None or w.train is not None
    ranks = participants(plan, loaded) if collectives else []
    ranks += [r for r in victim_ranks(plan, loaded) if r not in ranks]
    largest = largest_op(loaded, len(ranks))
    if largest > ID_MASK:
        o = w.options
        raise InputError(loaded.smap.where(("sizes",)) if loaded.smap else Where(str(loaded.file), key="sizes"),
                         f"an operation of {max(w.size_list()):,} bytes in slices of {o.slice:,} B over {len(ranks)} "
                         f"GPUs is about {largest:,} transfers, more than the {ID_MASK:,} one operation can number",
                         "a larger options.slice, smaller sizes or fewer participants")
    ops = build_ops(plan, loaded, ranks) if collectives and build else []
    return ranks, ops, flows.sequences(plan, w.flows, str(loaded.file))


def run_workload(plan: LabPlan, lab: LabDir, loaded: LoadedWorkload, out_dir: Path, progress=None,
                 trace=None) -> dict:
    """Play a workload; `trace` (lab.trace_path) lets the report say where ECMP put a ring's hops."""
    w = loaded.workload
    ranks, ops, tcp_flows = prepare(plan, loaded)
    out_dir.mkdir(parents=True, exist_ok=True)   # new_run_dir() made it for a command; experiments nest runs
    (out_dir / "workload.yml").write_text(loaded.text)
    (out_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    as_began = changes.record(lab)
    with procs.realtime():
        losses_before = ledger.snapshot(plan, lab.path)
    reactions_before, since = reaction.read(lab.path), time.monotonic()
    link_bytes_before, uplinks_before = linkbytes.snapshot(plan), fabricports.uplink_bytes(plan)
    # only where switch agents run: the watchers cost a few % of a core, and only their reaction needs them
    stalls = StallWatch(bool(agentreport.files(lab.path))).start()
    results, flow_results, series, long_reads, counters = _play(plan, lab, loaded, ops, tcp_flows, ranks,
                                                                out_dir, stalls, progress)
    link_bytes_after, uplinks_after = linkbytes.snapshot(plan), fabricports.uplink_bytes(plan)
    gaps = sum(q["gaps"] for c in counters.values() for q in c.get("rx", []))
    with procs.realtime():
        losses = ledger.ledger(losses_before, ledger.snapshot(plan, lab.path), plan, gaps)
    machine_gaps = stalls.stop()
    reactions = reaction.summary(reaction.read(lab.path).minus(reactions_before), plan.pfc_response_s,
                                 reaction.read_long(lab.path, since, long_reads), machine_gaps)
    nodes = gpu_ranks(plan)
    doc = {"workload": w.name, "lab": plan.lab, "dilation": plan.dilation, "ranks": ranks,
           "nodes": {r: nodes[r].name for r in ranks}, "options": w.options.model_dump(),
           "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "results": results,
           "counters": {str(r): c for r, c in counters.items()}, "queue_series": series,
           "flows": [f for f in flow_results if f["received"] or f["error"]], "loss_ledger": losses,
           "reordering": report.reordering(counters, w.options.model_dump(), losses["total"]) if ops else None,
           "uplinks": fabricports.uplink_deltas(uplinks_before, uplinks_after),
           "controller_reaction": reactions}
    doc.update(fabric_bytes(plan, ops, link_bytes_before, link_bytes_after, bool(tcp_flows)))
    if w.fsdp:
        group = _grouped(plan, ranks, w.fsdp.group_by, loaded)[1] if w.fsdp.group_by else w.fsdp.group_size
        doc["fsdp"] = _fsdp_summary(w, ranks, results, group)
    if w.train:
        first = next(k for k, op in enumerate(ops) if not op.warmup)
        doc["train"] = train_run.summary(plan, train_run.step_config(plan, loaded, ranks), ops[first].schedule,
                                         results[0], ops[first].compute_s)
        # top-level fabric_bytes_expected stays in the ports' unit (each link's frames, as measured);
        # train's own per-fabric payload figures stay in doc["train"]
        doc["dim_bytes"] = doc["train"]["dim_bytes"]
    if trace is not None:
        doc.update(placement.traced(plan, trace, w, [op.schedule for op in ops[:1]], ranks))
    changed = changes.during(as_began, lab)
    if changed:
        doc["changed_during_run"] = changed
    doc["busiest_uplink"] = fabricports.busiest_uplink(plan, doc["uplinks"], _measured_share(results, counters))
    doc["slow_run"] = causes.explain(doc, out_dir / "queues.csv")
    (out_dir / "results.json").write_text(json.dumps(doc, indent=1))
    return doc


def _play(plan: LabPlan, lab: LabDir, loaded: LoadedWorkload, ops: list, tcp_flows: list, ranks: list[int],
          out_dir: Path, stalls: StallWatch, progress) -> tuple[list, list, dict, list, dict]:
    """Run the operations and flows with the queue sampler going: (results, flow results, queue
    series, the controller's slow reads the sampler saw, agent counters). On any failure whatever
    had started stops, the stall watchers too."""
    w = loaded.workload
    nodes = gpu_ranks(plan)
    alpha = w.options.alpha * 1e-9 * plan.dilation
    options = RunOptions(qps=w.options.qps, sport_policy=w.options.sport,
                         cnp_interval_us=w.options.cnp_interval / 1000 if w.options.cnp else None,
                         reliable=w.options.reliable, ooo=w.options.ooo, dcqcn=w.options.dcqcn,
                         dcqcn_params=dcqcn_params(w.options))
    results = []
    pool = sampler = tcp = None
    try:
        pool = AgentPool(plan, lab, ranks, options) if ops else None
        stalls.ready()          # started before the agents, watching once they are
        sampler = QueueSampler(plan, out_dir / "queues.csv", lab_path=lab.path).start()
        tcp = FlowRun(tcp_flows).start() if tcp_flows else None
        floor = quiet_floor(plan, dcqcn_params(w.options) if w.options.dcqcn else None)
        for k, op in enumerate(ops):
            bound = bound_parts(plan, op.schedule, nodes, alpha)
            if op.compute_s:        # a train: step computes between its transfers: no network is faster
                bound = {**bound, "compute_s": op.compute_s, "total_s": bound["total_s"] + op.compute_s}
            ideal = bound["total_s"]
            # the last rank of a chain (a pipelined broadcast) hears nothing until the chain reaches it
            timeout, quiet = time_outs(w.options.timeout, ideal,
                                       max(floor, QUIET_FACTOR * chain_seconds(plan, op.schedule, nodes)))
            reports = pool.run(op.schedule, k, timeout, quiet)
            if progress:
                progress(k + 1, len(ops), op.label)
            if op.warmup:
                continue
            results.append({**_result(plan, op, ideal, reports), "bound": bound})
        if tcp is not None and not ops:
            tcp.wait(w.options.timeout / 1e9 if w.options.timeout else None)
    except BaseException:       # whatever had started stops: watchers, sampler, flows, agents
        if sampler is not None:
            sampler.close()
        stalls.stop()
        if tcp is not None:
            tcp.close()
        if pool is not None:
            pool.close(kill=True)
        raise
    flow_results = tcp.close() if tcp is not None else []
    series = sampler.close()
    counters = pool.close() if pool is not None else {}
    return results, flow_results, series, sampler.pfc.long_reads, counters


def fabric_bytes(plan: LabPlan, ops: list[Op], before: dict, after: dict, tcp: bool) -> dict:
    """Measured and expected bytes per fabric over the whole run (warm-up iterations included: the
    counters saw them), and the expected bytes of one step (one iteration of every operation)."""
    fmap, nodes = fabricmap.FabricMap(plan), gpu_ranks(plan)
    expected, step = fabricmap.zeros(), fabricmap.zeros()
    for op in ops:
        e = fmap.expected(op.schedule.transfers, nodes)
        for f, v in e.items():
            expected[f] += v
            step[f] += v if op.iteration == 0 and not op.warmup else 0
    measured = fabricmap.measured(plan, before, after)
    doc = {"fabric_bytes": measured, "fabric_bytes_expected": expected, "fabric_bytes_expected_step": step,
           "fabric_bytes_check": fabricmap.compare(measured, expected)}
    if tcp:
        doc["fabric_bytes_note"] = "TCP flows are measured but not in the expected figure (their headers and " \
                                   "ACKs depend on TCP's segmentation)"
    return doc


def _measured_share(results: list[dict], counters: dict) -> float:
    """The part of what the agents sent that the measured operations sent (warm-ups are the rest):
    port counters run across both."""
    measured = sum(p["bytes_sent"] for r in results for p in r["per_rank"].values())
    total = sum(q.get("bytes", 0) for c in counters.values() for q in c.get("tx", []))
    return min(1.0, measured / total) if total else 1.0


# With no `timeout` given, an operation may take up to SLOW_FACTOR x its bound as long as it moves,
# and stops once nothing has reached an agent for QUIET_FACTOR x its bound, or for the lab's own
# longest healthy silence if that is longer (pool.quiet_floor). A fixed 10x the bound cut off slow
# but healthy all-reduces on an emulated CPU (11x at 64 MB).
SLOW_FACTOR, QUIET_FACTOR = 100, 2


def time_outs(given_ns: int | None, ideal: float, floor: float) -> tuple[float, float]:
    """(deadline, quiet) in seconds for one operation: a given `timeout` is both; `floor` is the
    least silence allowed (pool.quiet_floor of the lab)."""
    if given_ns:
        return given_ns / 1e9, given_ns / 1e9
    return SLOW_FACTOR * ideal + 60, max(floor, QUIET_FACTOR * ideal)


def _result(plan: LabPlan, op: Op, ideal: float, reports: dict) -> dict:
    s = op.schedule
    victim_ids = {x.id for x in s.transfers if x.phase == "victim"}
    n = len({r for x in s.transfers if x.phase != "victim" for r in (x.src, x.dst)}) or len(s.ranks)
    t = max(r["end"] for r in reports.values())
    victim_s = None
    if victim_ids:    # the collective's time leaves the victim out; the victim's is when its bytes arrived
        t = max([x[2] for r in reports.values() for x in r["sends"] if x[0] not in victim_ids]
                + [x[1] for r in reports.values() for x in r["recvs"] if x[0] not in victim_ids])
        victim_s = max(x[1] for r in reports.values() for x in r["recvs"] if x[0] in victim_ids)
    if any(r["timed_out"] for r in reports.values()):
        # unfinished: the time until its agents gave up (the agents report it), never the last
        # byte that did arrive, which would read faster than the bound
        t = max([t] + [r.get("gave_up") or 0.0 for r in reports.values()])
    wrong = sum(len(r["missing"]) + sum(1 for x in r["recvs"] if not x[3]) for r in reports.values())
    algbw = op.size / t / 1e9 if t > 0 else 0.0
    factor = sch.bus_factor(op.collective, n) if op.collective != "fsdp_stage" else 1.0
    d = plan.dilation
    sent = s.bytes_sent()
    return {
        "label": op.label, "collective": op.collective, "algorithm": s.algorithm, "size": op.size, "n": n, "iteration": op.iteration,
        "stage": op.stage, "time_s": t, "algbw_GBps": algbw, "busbw_GBps": algbw * factor, "ideal_s": ideal,
        "ratio": t / ideal if ideal else None, "wrong": wrong, "victim_s": victim_s,
        "timed_out": any(r["timed_out"] for r in reports.values()),
        # a `go` that reached an agent after the common start: included in time_s, so shown
        "late_start_s": max((r.get("late_start_s", 0.0) for r in reports.values()), default=0.0),
        "real": {"time_s": t / d, "algbw_GBps": algbw * d, "busbw_GBps": algbw * factor * d, "ideal_s": ideal / d},
        "per_rank": {str(rank): {"end_s": rep["end"], "bytes_sent": sent.get(rank, 0), "sends": rep["sends"],
                                 "recvs": rep["recvs"], "missing": rep["missing"], "gave_up_s": rep.get("gave_up")}
                     for rank, rep in reports.items()},
    }


def _fsdp_summary(w, ranks: list[int], results: list[dict], group_size: int | None) -> dict:
    """The step's bytes per rank against its strategy's formula; `group_size` is HYBRID_SHARD's
    group as the step was built (group_by: resolves it from the lab)."""
    f = w.fsdp
    model = fsdp.model_from(f.model, f.layers, f.hidden, f.params_per_layer, f.dtype)
    n = len(ranks)
    first = [r for r in results if r["iteration"] == 0]
    per_rank = {rk: sum(r["per_rank"][str(rk)]["bytes_sent"] for r in first) for rk in ranks}
    scaled_model = model.bytes * f.scale
    expected, formula = fsdp.expected_per_rank(f.strategy, n, scaled_model, group_size)
    return {"model_bytes_scaled": scaled_model, "expected_full_shard_bytes_per_rank": 3 * (n - 1) / n * scaled_model,
            "expected_bytes_per_rank": expected, "expected_formula": formula,
            "bytes_per_rank": per_rank, "step_time_s": sum(r["time_s"] for r in first),
            "step_ideal_s": sum(r["ideal_s"] for r in first), "strategy": f.strategy}


def default_run_dir(name: str, base: Path | None = None) -> Path:
    base = base or Path("runs")
    return base / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
