"""Run an experiment end to end: build, capture, play the steps, tear down, judge, plot, report.

Everything is validated before the first namespace exists (the experiment, every workload, the
lab file with its variables); the lab is torn down whatever happens, and once per sweep value.
"""
from __future__ import annotations

import json
import multiprocessing
import operator
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from labctl import lifecycle as labmod, paths
from labctl.lifecycle.capture import Capture, file_name
from labctl.errors import InputError, LabError
from labctl.paths import is_dir
from labctl.experiment import plots, trainplots, wan
from labctl.experiment.metrics import run_metrics
from labctl.experiment.resolve import in_experiment, resolve
from labctl.experiment.spec import METRICS, Experiment, TcStep, load_experiment
from labctl.plan.model import LabPlan
from labctl.telemetry import agentreport, fabricports
from labctl.traffic.run import run_workload
from labctl.traffic.workload import LoadedWorkload, load_workload

OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def lab_name(exp: Experiment) -> str:
    """x-<name>; $LABCTL_EXPERIMENT_PREFIX replaces x- (tests use their own prefix)."""
    return (os.environ.get("LABCTL_EXPERIMENT_PREFIX", "x-") + exp.name)[:24].rstrip("-")


def prepare(path: Path, out: Path, sets: list[str] = (), opened: dict | None = None) \
        -> tuple[Experiment, str, dict[int, LoadedWorkload]]:
    """Load and check everything the experiment will use, before anything is built. `sets` (from
    `labctl run --set`) come after the experiment's own set:, and before its sweep value. `opened`
    gets the experiment file that was read (its real path and fstat), which the trust model judges."""
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    opened = opened if opened is not None else {}
    exp, text, smap = load_experiment(path, opened)
    author = opened["stat"].st_uid
    refs = [(("topology",), exp.topology)] + [(("steps", k, "run"), s.run) for k, s in enumerate(exp.steps)
                                              if isinstance(s.run, str)]
    for key, ref in refs:
        if not paths.readable_by(path.parent / ref, author):
            # root reads what it is told; the author may name a file only they could read themselves
            # (a lab or workload file that is not one quotes its first line in the error)
            raise InputError(smap.where(key), f"{ref} is not a file the experiment's author (uid {author}) may "
                             "read: labctl reads for an experiment only what its author could",
                             "name a lab or workload file the experiment's owner can read")
    workloads = {}
    out.mkdir(parents=True, exist_ok=True)
    for k, step in enumerate(exp.steps):
        if step.run is None:
            continue
        if isinstance(step.run, dict):
            inline = out / f"workload-{step.as_ or k + 1}.yml"
            inline.write_text(yaml.safe_dump(step.run, sort_keys=False))
            try:
                workloads[k] = load_workload(inline)
            except InputError as exc:
                raise in_experiment(smap, ("steps", k, "run"), exc) from None
        else:
            workloads[k] = load_workload(path.parent / step.run)
    for value in exp.sweep.values if exp.sweep else [None]:
        try:
            plan = compile_plan(load_topology(str(path.parent / exp.topology), _sets(exp, value, sets), lab_name(exp)))
        except InputError as exc:
            if exc.where is None or exc.where.file != "--set":
                raise
            if exc.where.key in {s.split("=", 1)[0] for s in sets}:
                raise InputError(exc.where, f"{exc.message} (in {exp.topology}, from labctl run --set)", exc.fix) from None
            key = ("sweep", "var") if exp.sweep and exc.where.key == exp.sweep.var else ("set",)
            raise InputError(smap.where(key), f"{exc.message} (in {exp.topology})", exc.fix) from None
        resolve(exp, smap, plan, workloads)
    return exp, text, workloads


def _sets(exp: Experiment, value, extra: list[str] = ()) -> list[str]:
    return list(exp.set) + list(extra) + ([f"{exp.sweep.var}={value}"] if value is not None else [])


def _wan_bytes(lab, fresh_within: float = 1.0) -> float:
    """The bytes the lab's WAN lines delivered so far. A line publishes its counters every 0.2 s
    (wan/line.py): a copy from before the last run's final frames moved bytes from one run to the
    next, so this waits (at most `fresh_within` s) for one written after it was asked."""
    f = lab.path / "wan.json"
    asked = time.time()
    deadline = time.monotonic() + fresh_within
    try:
        while os.stat(f).st_mtime <= asked and time.monotonic() < deadline:
            time.sleep(0.02)
        return sum(d["delivered_bytes"] for d in json.loads(f.read_text())["directions"])
    except (OSError, ValueError, KeyError):
        return 0.0


def run_experiment(path: Path, out: Path, say=lambda msg: print(msg, file=sys.stderr, flush=True),
                   sets: list[str] = ()) -> dict:
    path = Path(path)
    read_as: dict = {}
    exp, text, workloads = prepare(path, out, sets, read_as)
    (out / "experiment.yml").write_text(text)
    metrics: dict[str, dict] = {}
    runs: dict[str, Path] = {}
    captures: list[str] = []
    name = lab_name(exp)
    for value in exp.sweep.values if exp.sweep else [None]:
        suffix = f"@{value}" if value is not None else ""
        lab_sets = _sets(exp, value, sets)
        say(f"[{exp.name}] up {exp.topology}{' with ' + ' '.join(lab_sets) if lab_sets else ''}")
        plan, lab, _ = labmod.up(str(path.parent / exp.topology), lab_sets, name, set_by=(read_as,))
        caps = []
        try:
            for c in exp.captures:
                f = out / "captures" / (file_name(c.port).replace(".pcapng", f"{suffix}.pcapng"))
                f.parent.mkdir(exist_ok=True)
                caps.append(Capture(plan, c.port, f, c.snaplen, c.filter, journal=lab.journal))
            for k, step in enumerate(exp.steps):
                _step(exp, k, step, plan, lab, workloads, out, suffix, metrics, runs, say)
        finally:
            for cap in caps:
                captures.append(str(cap.stop().relative_to(out)))
            keep_lab_records(lab.path, out / f"lab{suffix}")
            labmod.down(name)
            say(f"[{exp.name}] down")
    checks = judge(exp, metrics)
    figures = draw(plan, runs, out)
    if exp.figure:
        bounds = {e.metric: e.value for e in exp.expect if e.op in ("<", "<=") and e.value is not None
                  and e.share_of is None and e.metric in exp.figure}
        plots.summary(metrics, exp.figure, out / "summary.png", bounds)
    doc = {"experiment": exp.name, "description": exp.description.strip(), "metrics": metrics,
           "expectations": checks, "passed": all(c["passed"] for c in checks), "plots": figures,
           "captures": captures, "runs": {k: str(v.relative_to(out)) for k, v in runs.items()},
           "summary_plot": "summary.png" if exp.figure else None, "notes": run_notes(runs, metrics, exp.sweep.var if exp.sweep else None)}
    (out / "experiment.json").write_text(json.dumps(doc, indent=1))
    from labctl.experiment.report import write_report
    write_report(out, exp, doc)
    return doc


def run_notes(runs: dict[str, Path], metrics: dict[str, dict], sweep_var: str | None = None) -> dict[str, list[str]]:
    """What each run's results say in words: where ECMP put a ring's hops (and which collided),
    what reordering did, and whether its WAN queue filled at all."""
    from labctl.experiment.wan import unfilled_queues
    from labctl.traffic.report import reordering_line
    unfilled = unfilled_queues(metrics, sweep_var)
    out = {}
    for name, run_dir in runs.items():
        doc = json.loads((run_dir / "results.json").read_text())
        notes = []
        placement = doc.get("ring_placement") or {}
        if placement.get("hops"):
            notes.append("ring hops: " + ", ".join(f"{h['from']} -> {h['to']} on {h['spine']}" for h in placement["hops"]))
        if placement.get("note"):
            notes.append(placement["note"])
        if doc.get("reordering"):
            notes.append(reordering_line(doc["reordering"]).lstrip("# "))
        if name in unfilled:
            notes.append(unfilled[name])
        if notes:
            out[name] = notes
    return out


LAB_RECORDS = ("plan.json", "pfc.json", "wan.json")


def keep_lab_records(lab_path: Path, dest: Path) -> None:
    """The lab's plan, last PFC and WAN counters and its helpers' logs (controller.log, ...) go with
    the experiment: `down` removes the lab's directory, and a failed expectation is read from them.
    Agents in the nodes leave one report each: pfc.json is their merge (agentreport.py), and their
    logs are kept as agents/NODE.log."""
    dest.mkdir(exist_ok=True)
    for f in sorted(lab_path.iterdir()):
        if (f.name in LAB_RECORDS or f.suffix == ".log") and f.is_file() and not f.is_symlink():
            dest.joinpath(f.name).write_bytes(f.read_bytes())
    nodes = agentreport.agent_nodes(lab_path)
    if nodes:
        merged = agentreport.load(lab_path)
        if merged is not None:
            dest.joinpath(agentreport.FILE).write_text(json.dumps(merged))
        dest.joinpath(agentreport.DIRECTORY).mkdir(exist_ok=True)
        for node in nodes:
            text = agentreport.read_agent_file(agentreport.directory(lab_path, node) / "agent.log")
            if text is not None:
                dest.joinpath(agentreport.DIRECTORY, f"{node}.log").write_bytes(text)


def _step(exp, k, step, plan, lab, workloads, out, suffix, metrics, runs, say) -> None:
    if step.run is not None:
        run_name = (step.as_ or f"run{k + 1}") + suffix
        say(f"[{exp.name}] run {run_name}")
        before, links_before = _wan_bytes(lab), fabricports.link_sent_bytes(plan)
        run_dir = out / "runs" / run_name
        run_workload(plan, lab, workloads[k], run_dir, trace=labmod.trace_path)
        metrics[run_name] = run_metrics(plan, run_dir, _wan_bytes(lab) - before)
        links_after = fabricports.link_sent_bytes(plan)
        metrics[run_name]["wan_port_bytes"] = sum(map(sum, links_after.values())) - sum(map(sum, links_before.values()))
        metrics[run_name].update(wan.path_metrics(plan, links_before, links_after))
        runs[run_name] = run_dir
    elif step.tc is not None:
        _tc(plan, lab, step.tc)
    elif step.link is not None:
        (state, target), = step.link.items()
        from labctl.lifecycle import targets
        node, port = targets.port(plan, target)
        labmod.set_link_state(lab, plan, node, port.name, state == "up")
    elif step.wait is not None:
        time.sleep(step.wait / 1e9)
    elif step.lb is not None:
        for target, mode in step.lb.items():
            say(f"[{exp.name}] lb {target}={mode}")
            labmod.set_lb(lab, plan, target, mode)


def _tc(plan, lab, tc: TcStep) -> None:
    from labctl.lifecycle import targets
    node, iface = targets.port(plan, tc.target, need_port=False)
    labmod.tc_set(lab, plan, node, iface.name if iface else None, tc.class_, tc.rate, **tc.settings())


def judge(exp: Experiment, metrics: dict[str, dict]) -> list[dict]:
    points = [f"@{v}" for v in exp.sweep.values] if exp.sweep else [""]
    out = []
    for e in exp.expect:
        what = e.what or f"{e.metric} of {e.run}"
        if e.trend:
            seq = [metrics[e.run + p][e.metric] for p in points]
            ok = all((b > a) if e.trend == "increasing" else (b < a) for a, b in zip(seq, seq[1:]))
            out.append({"what": what, "passed": ok, "measured": f"{e.metric} of {e.run} over "
                        f"{exp.sweep.var} = {', '.join(map(str, exp.sweep.values))}: "
                        f"{', '.join(_fmt(x) for x in seq)} ({e.trend} expected)"})
            continue
        for p in ([""] if "@" in e.run else points):
            left = metrics[e.run + p][e.metric]
            if e.than:
                other = e.than.metric or e.metric
                them = e.than.run if "@" in e.than.run else e.than.run + p
                base = metrics[them][other]
                right = base * e.factor
                rhs = (f"{_fmt(e.factor)} x {other} of {them} ({_fmt(base)}) = {_fmt(right)}" if e.factor != 1
                       else f"{other} of {them} ({_fmt(base)})")
            elif e.share_of:
                a, b = (metrics[r if "@" in r else r + p][e.metric] for r in (e.share_of.from_, e.share_of.to))
                got = left
                left = (a - got) / (a - b) if a != b else 0.0
                right, rhs = e.value, (f"{_fmt(e.value)} (the share of the way from {e.share_of.from_}'s "
                                       f"{_fmt(a)} to {e.share_of.to}'s {_fmt(b)} that {_fmt(got)} went)")
            else:
                right, rhs = e.value, _fmt(e.value)
            ok = OPS[e.op](left, right)
            name = f"share of {e.metric} of {e.run + p}" if e.share_of else f"{e.metric} of {e.run + p}"
            out.append({"what": what, "passed": bool(ok), "measured": f"{name} = {_fmt(left)} {e.op} {rhs}"})
    return out


def _fmt(x: float) -> str:
    return f"{x:.4g}" if isinstance(x, float) and not float(x).is_integer() else f"{int(x)}"


def draw(plan, runs: dict[str, Path], out: Path) -> dict[str, list[str]]:
    """The plots of every run, into the run directory; paths relative to `out`. Runs are drawn on
    every CPU at once: the labs are down by now, and matplotlib takes about a second per run."""
    workers = min(len(runs), len(os.sched_getaffinity(0)))
    if workers < 2:
        return {name: _draw_run(plan, run_dir, out) for name, run_dir in runs.items()}
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        made = {name: pool.submit(_draw_run, plan, run_dir, out) for name, run_dir in runs.items()}
        return {name: future.result() for name, future in made.items()}


def _draw_run(plan, run_dir: Path, out: Path) -> list[str]:
    made = []
    doc = json.loads((run_dir / "results.json").read_text())
    drawings = [("queue_depth.png", lambda p: plots.queue_depth(run_dir, plan, p)),
                ("throughput.png", lambda p: plots.throughput(run_dir, p)),
                ("ecmp_balance.png", lambda p: plots.ecmp_balance(run_dir, plan, p)),
                ("pauses_marks.png", lambda p: plots.pauses_and_marks(run_dir, p)),
                ("fabric_load.png", lambda p: plots.fabric_load(run_dir, plan, p))]
    if any(lk.wire for lk in plan.links):
        # the run's own plan: a sweep over the WAN buffer builds each point's lab anew
        drawings.append(("wan_queue.png", lambda p: wan.wan_queue_plot(run_dir, LabPlan.from_dict(
            json.loads((run_dir / "plan.json").read_text())), p)))
    if doc.get("train"):
        drawings.append(("bursts.png", lambda p: trainplots.bursts(run_dir, p)))
    if doc["results"]:
        drawings += [("timeline.png", lambda p: plots.timeline(run_dir, p)),
                     ("sender_rates.png", lambda p: plots.sender_rates(run_dir, p))]
    for file, draw_one in drawings:
        draw_one(run_dir / file)
        made.append(str((run_dir / file).relative_to(out)))
    return made


def experiment_files(target: Path) -> list[Path]:
    if is_dir(target):
        files = sorted(p for p in target.glob("*.yml"))
        if not files:
            raise LabError(f"{target} holds no experiment files (*.yml)")
        return files
    return [target]


def is_experiment(path: Path) -> bool:
    """An experiment file has steps:; a workload file does not."""
    if is_dir(path):
        return True
    from labctl.topology.yamlpos import load_yaml_file
    try:
        data = load_yaml_file(path, "file", "", "")[1]
    except InputError:
        return False        # loading it as a workload then reports what is wrong, with its line
    return "steps" in data


__all__ = ["run_experiment", "experiment_files", "is_experiment", "METRICS", "InputError"]
