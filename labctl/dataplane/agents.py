"""Where a lab's switch agents run: one on the host for every node (`lab`), or one inside each node
that needs one (`node`), as a switch's own software would. Both are the same code
(controller.py) given different shares of the plan (plan/share.py).

    LABCTL_SWITCH_AGENTS=lab|node     (default: lab)

`lab` is the fastest on one machine: one process, one loop, one real-time thread for every queue
(a 1,024-GPU lab has 1,200 nodes with lossless classes). `node` is what a node needs to take its
PFC and ECN with it, into a container, another machine or another tool: the agent reads only its
node's share, opens every socket inside the node's namespace, and reports to its own file, which
report.py merges with the others for every reader.

Each node's agent has a directory in the lab's, `agents/NODE/`: its share (share.json), its
counters (pfc.json) and its log (agent.log).
"""
from __future__ import annotations

import sys
from pathlib import Path

from labctl import helpers
from labctl.dataplane.controller import Controller
from labctl.errors import LabError
from labctl.kernel import nsutil
from labctl.plan.share import PLACEMENT_ENV as ENV  # noqa: F401 (for readers)
from labctl.plan.share import PLACEMENTS as MODES  # noqa: F401 (for readers)
from labctl.plan.share import SHARE_FILE
from labctl.plan.share import placement as mode  # noqa: F401 (for readers)
from labctl.plan.share import read as read_share
from labctl.telemetry import agentreport

MODULE = "labctl.dataplane.agents"      # `python -m` it: main() below
CARRIED_START_S = 5                     # how long an exported lab's agent may take to appear after its exec line


def start_in_nodes(plan, lab) -> dict[str, int]:
    """Write each served node's share and start its agent: inside its container where it can run
    there (containers/nodes.py agent_inside), else from the host moved into its namespace. All
    start together, then each is awaited. Returns node -> PID (on the host). A node whose agent
    fails to start fails `up`, which rolls back."""
    from labctl import procs
    from labctl.cluster.engines import Engines
    from labctl.containers import nodes
    from labctl.plan import share
    from labctl.state import AGENTS, agent_directory
    started, engines = [], Engines()
    try:
        for own in share.shares(plan):
            name = own.node.name
            share.write(own, agent_directory(lab.path, name))
            log = f"{AGENTS}/{name}/agent"
            if nodes.agent_inside(own.node):
                # as `docker exec` runs it: the container's namespaces, root and capabilities
                argv = engines.argv(own.node, ["/usr/bin/env", f"PYTHONPATH={nodes.AGENT_CODE}", "python3", "-P",
                                               "-m", MODULE, "--here", nodes.AGENT_HOME])
                started.append((name, log, helpers.launch_argv(lab, argv, log), True))
            else:
                started.append((name, log, helpers.launch(lab, MODULE, log, (name,)), False))
    finally:
        engines.close()
    pids = {}
    for name, log, p, inside in started:
        helpers.await_ready(p, f"the switch agent of {name}", lab.path / f"{log}.log")
        p.stdout.close()
        pid = p.pid
        if inside:
            # the engine started it (`docker exec`): the agent is the engine's child, found in
            # the container by its module
            pid = _inside_pid(lab, plan.node(name))
            if pid is None:
                raise LabError(f"the switch agent of {name} said ready, but no process of its container runs it",
                               f"see {lab.path / f'{log}.log'}")
            lab.journal("pid", procs.identity(pid))
            procs.share_cpu_group(pid)
        procs.prioritise_all(pid)
        pids[name] = pid
    return pids


def prioritise_carried(plan) -> None:
    """The agents an exported lab's exec lines started in its containers run as labctl's own do:
    in labctl's CPU group and real-time. `docker exec` leaves them in their container's group,
    which has no real-time budget, and at nice -10 their pauses came late enough to lose frames of
    the incast."""
    from labctl import procs
    from labctl.cluster.engines import Engines
    from labctl.containers import nodes
    carried = [n for n in plan.nodes if nodes.carries_agent(n)]
    if not carried:
        return
    import time
    engines = Engines()
    try:
        for node in carried:
            ctr = engines.container(node)
            deadline = time.monotonic() + CARRIED_START_S     # its exec line forks it, then returns
            pid = nodes.exec_pid(ctr, MODULE)
            while pid is None and time.monotonic() < deadline:
                time.sleep(0.05)
                pid = nodes.exec_pid(ctr, MODULE)
            if pid is not None:
                procs.share_cpu_group(pid)
                procs.prioritise_all(pid)
    finally:
        engines.close()


def _inside_pid(lab, node) -> int | None:
    from labctl.cluster.engines import Engines
    from labctl.containers import nodes
    engines = Engines()
    try:
        return nodes.exec_pid(engines.container(node), MODULE)
    finally:
        engines.close()


def node_agent(lab_dir: Path, name: str) -> Controller:
    """Node `name`'s own agent, started from the host: moved into the node's namespace first, so
    every socket, program and rule it opens is the node's, as if it ran on the switch."""
    own_dir = agentreport.directory(lab_dir, name)
    own = read_share(own_dir / SHARE_FILE, lab_dir.name)     # a lab's directory is named after it (state.py)
    if own.node.name != name:
        raise ValueError(f"{own_dir / SHARE_FILE} is the share of {own.node.name!r}, not {name!r}")
    nsutil.enter_for_good(own.node.namespace)
    # its directory is all it reads and writes: its share, its part of control.json, its report
    return Controller([own], own_dir, own_dir / agentreport.FILE)


def agent_here(home: Path, build: bool = False) -> Controller:
    """The agent of the node this process runs in (its container, which has no /run/netns), from
    the share in its directory `home`: it enters nothing, and takes its ports' numbers from the
    node. With `build`, it first builds the node's traffic classes itself (nodebuild.py): where it
    runs under another tool (an exported lab under containerlab), nothing else does."""
    from labctl.dataplane import nodebuild
    own = read_share(home / SHARE_FILE)
    nsutil.stay_here(own.node.namespace)
    nodebuild.adopt_ports(own)
    if build:
        nodebuild.build_queues(own)
    return Controller([own], home, home / agentreport.FILE)


def main() -> None:
    """`LAB_DIR NODE`: that node's own agent, started from the host, reading only its share.
    `--here DIR [--build]`: the agent of the node this runs in, from the share in DIR (inside a
    container), building its queues first with --build."""
    if sys.argv[1:2] == ["--here"] and len(sys.argv) > 2:
        build = sys.argv[3:4] == ["--build"]
        helpers.serve(lambda _, home: agent_here(home, build), with_plan=False, lab_dir=Path(sys.argv[2]))
    elif len(sys.argv) == 3:
        helpers.serve(lambda _, lab_dir: node_agent(lab_dir, sys.argv[2]), with_plan=False)
    else:
        sys.exit("usage: python -m labctl.dataplane.agents LAB_DIR NODE | --here DIR [--build]")


if __name__ == "__main__":
    main()
