"""Building and removing labs: up, down, clean. A failure half-way through `up` removes what it made."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from labctl import backends, helpers, procs, state
from labctl.kernel import ecnpath, flowhash, lb
from labctl.dataplane import agents, arrivals, control
from labctl.errors import InputError, Where
from labctl.backends.base import own_namespaces, refuse_taken_namespaces
from labctl.kinds import node_kind
from labctl.lifecycle import convergence, software
from labctl.lifecycle.labs import backend_of, find_lab, require_root
from labctl.plan import share
from labctl.plan import trust as trust_model
from labctl.plan.compile import compile_plan
from labctl.plan.model import LabPlan
from labctl.topology import sources
from labctl.topology.load import Loaded


def up(file: str | None, sets=(), name: str | None = None, template_dirs=(), backend: str = "netns",
       progress=None, topo: str | None = None, maps=None, build_images: bool = True, trust: bool = False,
       hosts: list[str] | None = None, spread: str = "server",
       set_by: tuple[dict, ...] = ()) -> tuple[LabPlan, state.LabDir, float]:
    """Build a lab file (or, with `topo`, a Mininet topology: see topology/sources.py); `maps`
    (topology.clabmaps.ImportMaps) maps a containerlab file's kinds and images; `trust` vouches for
    a lab whose powerful lines (plan/trust.py) come from files root does not own; `hosts` places
    its nodes over those machines by the `spread` rule (topology/placement.py); `set_by` holds the
    files `sets` came from (an experiment's) as they were read (yamlpos.read_input's real path and
    fstat), which the trust model judges as the lab's own."""
    loaded = sources.load(file, sets, template_dirs, name, topo, maps, trust)
    loaded.set_by = tuple(set_by)
    if hosts:
        from labctl.topology.placement import apply_hosts
        apply_hosts(loaded, hosts, spread)
    return build(loaded, backend, progress, str(Path(file).resolve()) if file else f"mininet:{topo}",
                 build_images, trust)


def plan_for(loaded: Loaded, backend: str = "netns", build_images: bool = True, trust: bool = False):
    """A loaded lab's plan and the backend that will build it, checked by that backend and by the
    trust model (a located InputError) before anything exists; needs no root."""
    plan = compile_plan(loaded, arrivals.choose())
    trust_model.require(loaded, trust)
    flowhash.adopt(plan, loaded.topology.routing.hash_policy, loaded.topology.routing.hash_seed)
    builder = backends.get(backend)
    builder.build_images = build_images
    for node in plan.nodes:
        if not node_kind(node.kind).built_by(backend):
            raise InputError(Where(str(loaded.file), key=f"nodes.{node.name}.kind"),
                             f"backend {backend!r} cannot build a {node.kind} node ({node.name})",
                             f"kind {node.kind} is built by: {', '.join(node_kind(node.kind).backends)}")
    for key, reason, fix in builder.check(plan):
        raise InputError(Where(str(loaded.file), key=key), reason, fix)
    refused = share.memory_refusal(plan, procs.mem_available())
    if refused:
        raise InputError(Where("environment", key=share.PLACEMENT_ENV), *refused)
    return plan, builder


def build(loaded: Loaded, backend: str = "netns", progress=None,
          topology_file: str | None = None, build_images: bool = True,
          trust: bool = False) -> tuple[LabPlan, state.LabDir, float]:
    """Build a loaded (validated) lab: its plan, by `backend`, with a record in the state directory."""
    plan, builder = plan_for(loaded, backend, build_images, trust)
    require_root("labctl up")
    with state.lock(f"labctl up {plan.lab}"):       # one up/down/clean at a time: names checked, then made
        lab = state.claim(plan.lab, plan.to_dict(), topology_file)
        try:
            lab.write_state(backend=backend)       # before anything exists: `clean` must know who built it
            refuse_taken_namespaces(plan)          # another lab's, named: nothing exists yet
            t0 = time.perf_counter()
            kwargs = {"progress": progress} if progress else {}
            builder.apply(plan, lab, **kwargs)
        except BaseException:
            if lab.path.exists():      # refused before the backend made anything: no "building" record stays
                builder.destroy(lab)
            raise
        try:
            lb.wire(plan)
            ecnpath.wire(plan, lambda n, i, c: control.settings_for(plan, n, i, c, {}))
            software.run_exec_lines(plan, lab, progress)
            agents.prioritise_carried(plan)
            software.learn_addresses(plan, lab)
            start_controller(plan, lab)
            start_line(plan, lab)
            # last: the helpers' start takes CPU that routing daemons' BFD timers need, so the
            # routing `up` promises is checked once they run
            converged = convergence.wait_converged(plan)
            if converged:
                lab.write_state(routing_converged_s=round(converged, 3))
            elapsed = time.perf_counter() - t0
            from labctl.telemetry import ledger
            # the record says "up" last, inside the rollback: Ctrl-C before it removes the lab
            lab.write_state(status="up", pid=None, build_seconds=round(elapsed, 3),
                            machine_counters_at_up=ledger.machine_wide_text())
        except BaseException:
            builder.destroy(lab)
            raise
    return plan, lab, elapsed


def start_controller(plan: LabPlan, lab: state.LabDir) -> int | None:
    """The switch agents (ECN profiles, PFC), if any class needs them: one on the host for the
    whole lab, or one inside each node that needs one (dataplane/agents.py)."""
    from labctl.dataplane import controller
    if not controller.needed(plan):
        return None
    if agents.mode() == "node" or any(n.machine for n in plan.nodes):
        lab.write_state(agent_pids=agents.start_in_nodes(plan, lab))
        return None
    pid = helpers.start(lab, "labctl.dataplane.controller", "controller", "the data-plane controller")
    lab.write_state(controller_pid=pid)
    return pid


def start_line(plan: LabPlan, lab: state.LabDir) -> int | None:
    """The WAN line (delay, loss, jitter, ESP) for links that need one; fresh ESP keys first."""
    from labctl.kernel import wires
    from labctl.wan.keys import write_keys
    if not wires.wired(plan):
        return None
    write_keys(plan, lab.path)
    pid = helpers.start(lab, "labctl.wan.line", "line", "the WAN line")
    lab.write_state(line_pid=pid)
    return pid


def down(name_or_file: str) -> list[str]:
    require_root("labctl down")
    with state.lock(f"labctl down {name_or_file}"):
        lab = find_lab(name_or_file)
        return backend_of(lab).destroy(lab)


@dataclass
class CleanResult:
    lab: str
    reason: str
    removed: list[str]


def clean(everything: bool = False) -> list[CleanResult]:
    """Remove labs whose build died half-way (and records whose namespaces are all gone).

    Works from the lab records only: a namespace that no record lists is never touched.
    """
    require_root("labctl clean")
    out = []
    with state.lock("labctl clean"):
        for lab in state.all_labs():
            st = lab.read_state()
            pid = st.get("pid")
            if st.get("status") == "building" and state.building_now(st) and pid != os.getpid():
                continue  # still being built
            if st.get("status") == "building":
                reason = f"build interrupted (process {pid} is gone)"
            elif not own_namespaces(lab)[0]:
                reason = "record of a lab whose namespaces are gone"
            elif everything:
                reason = "--all"
            else:
                continue
            out.append(CleanResult(lab.name, reason, backend_of(lab).destroy(lab)))
    return out
