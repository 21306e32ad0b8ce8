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

import os

from labctl.errors import InputError, Where

ENV = "LABCTL_SWITCH_AGENTS"
MODES = ("lab", "node")


def mode() -> str:
    """The placement `up` uses now (LABCTL_SWITCH_AGENTS, else one agent for the lab)."""
    value = os.environ.get(ENV, "lab") or "lab"
    if value not in MODES:
        raise InputError(Where("environment", key=ENV), f"{value!r} is not a placement of switch agents",
                         f"set {ENV} to 'lab' (one agent on the host serves every node) or 'node' "
                         "(an agent inside each node that needs one)")
    return value


def start_in_nodes(plan, lab) -> dict[str, int]:
    """Write each served node's share and start its agent inside it; all start together, then each
    is awaited. Returns node -> PID. A node whose agent fails to start fails `up` (which rolls back)."""
    from labctl import helpers
    from labctl.plan import share
    from labctl.telemetry import agentreport
    started = []
    for own in share.shares(plan):
        d = agentreport.directory(lab.path, own.node.name)
        share.write(own, d)
        log = f"{agentreport.DIRECTORY}/{own.node.name}/agent"
        started.append((own.node.name, log, helpers.launch(lab, "labctl.dataplane.controller", log,
                                                          (own.node.name,))))
    pids = {}
    for name, log, p in started:
        helpers.await_ready(p, f"the switch agent of {name}", lab.path / f"{log}.log")
        p.stdout.close()
        pids[name] = p.pid
    return pids
