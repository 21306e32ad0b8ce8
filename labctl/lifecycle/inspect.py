"""Looking at a running lab: the plan merged with what the kernel and the helpers say now."""
from __future__ import annotations

import json
import os

from labctl import procs, state
from labctl.kernel import nsutil, rtnl
from labctl.lifecycle.labs import load_plan

OPERSTATE = {0: "unknown", 1: "notpresent", 2: "down", 3: "lowerlayerdown", 4: "testing", 5: "dormant",
             6: "up"}


def live_links(namespace: str) -> dict[str, dict]:
    with nsutil.netlink_socket(namespace) as sock:
        return rtnl.link_dump(sock)


def status(lab: state.LabDir) -> dict:
    """The plan merged with what the kernel says now (namespace present, port state and counters)."""
    plan = load_plan(lab)
    st = lab.read_state()
    nodes = []
    for node in plan.nodes:
        present = nsutil.exists(node.namespace)
        live = live_links(node.namespace) if present and os.geteuid() == 0 else {}
        ports = []
        for i in node.interfaces:
            info = live.get(i.name, {})
            link = plan.links[i.link]
            ports.append({"name": i.name, "address": i.address, "peer": f"{i.peer_node}:{i.peer_iface}",
                          "vxlan_to": plan.node(i.peer_node).machine if link.machines else None,
                          "fabric": i.fabric, "rate_bps": i.shaping.rate_bps,
                          "state": OPERSTATE.get(info.get("operstate"), "absent") if live else "unknown",
                          **{k: info.get(k) for k in rtnl.STATS_FIELDS if k in info}})
        nodes.append({"name": node.name, "kind": node.kind, "namespace": node.namespace, "present": present,
                      "image": node.container.image if node.container else None, "machine": node.machine,
                      "loopback": node.loopback, "rank": node.rank, "interfaces": ports})
    return {"lab": plan.lab, "status": st.get("status"), "topology_file": st.get("topology_file"),
            "dilation": plan.dilation, "nodes": nodes, "helpers": helpers(lab)}


def helpers(lab: state.LabDir) -> list[dict]:
    """Each helper process the lab needs (switch agents, WAN line): running or not, and what it reports."""
    from labctl.telemetry import agentreport
    st = lab.read_state()
    journaled = {int(e.partition(":")[0]): e for e in lab.journaled("pid") if e.partition(":")[0].isdigit()}
    wanted = [("controller", st.get("controller_pid"), lambda: agentreport.load(lab.path) or {}, "controller.log"),
              ("WAN line", st.get("line_pid"), lambda: _read_json(lab.path / "wan.json"), "line.log")]
    for node, pid in sorted((st.get("agent_pids") or {}).items()):
        where = agentreport.directory(lab.path, node)
        wanted.append((f"switch agent {node}", pid, lambda f=where / agentreport.FILE: agentreport.read_report(f) or {},
                       f"{agentreport.DIRECTORY}/{node}/agent.log"))
    out = []
    for name, pid, read, log in wanted:
        if not pid:
            continue
        alive = pid in journaled and procs.verified(journaled[pid]) == pid
        doc = read()
        notes = []
        if "reaction_hist" in doc:
            from labctl.telemetry import reaction
            h = reaction.Histogram.from_list(doc["reaction_hist"])
            if h.samples or name == "controller":
                notes.append(reaction.describe(reaction.summary(h, load_plan(lab).pfc_response_s)))
            else:       # a node's agent: a host's only obeys pauses, a switch's has read no busy queue yet
                notes.append("no busy queue read yet")
        errors = doc.get("errors") or []
        if errors:
            notes.append(f"{len(errors)} refused change(s), last: {errors[-1]}")
        out.append({"helper": name, "pid": pid, "running": alive, "errors": errors,
                    "note": "; ".join(notes) if alive else f"NOT RUNNING: see {lab.path / log}"})
    return out


def _read_json(f) -> dict:
    try:
        doc = json.loads(f.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}