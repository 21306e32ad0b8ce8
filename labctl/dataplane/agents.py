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

from labctl.plan.share import PLACEMENT_ENV as ENV  # noqa: F401 (for readers)
from labctl.plan.share import PLACEMENTS as MODES  # noqa: F401 (for readers)
from labctl.plan.share import placement as mode  # noqa: F401 (for readers)


MODULE = "labctl.dataplane.controller"


def start_in_nodes(plan, lab) -> dict[str, int]:
    """Write each served node's share and start its agent: inside its container where it can run
    there (containers/nodes.py agent_inside), else from the host moved into its namespace. All
    start together, then each is awaited. Returns node -> PID (on the host). A node whose agent
    fails to start fails `up`, which rolls back."""
    from labctl import helpers, procs
    from labctl.containers import engine, nodes
    from labctl.plan import share
    from labctl.state import AGENTS, agent_directory
    started, client = [], None
    try:
        for own in share.shares(plan):
            name = own.node.name
            share.write(own, agent_directory(lab.path, name))
            log = f"{AGENTS}/{name}/agent"
            if nodes.agent_inside(own.node):
                client = client or engine.client()
                # as `docker exec` runs it: the container's namespaces, root and capabilities
                argv = nodes.enter_argv(client, own.node.container.name,
                                        ["/usr/bin/env", f"PYTHONPATH={nodes.AGENT_CODE}", "python3", "-P", "-m",
                                         MODULE, "--here", nodes.AGENT_HOME])
                started.append((name, log, helpers.launch_argv(lab, argv, log), True))
            else:
                started.append((name, log, helpers.launch(lab, MODULE, log, (name,)), False))
    finally:
        if client is not None:
            client.close()
    pids = {}
    for name, log, p, inside in started:
        helpers.await_ready(p, f"the switch agent of {name}", lab.path / f"{log}.log")
        p.stdout.close()
        pid = p.pid
        if inside:
            # nsenter forks the process that enters the container's PID namespace: the agent
            pid = procs.descendant(p.pid)
            lab.journal("pid", procs.identity(pid))
        procs.prioritise_all(pid)
        pids[name] = pid
    return pids
