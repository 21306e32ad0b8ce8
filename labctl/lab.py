"""Lab lifecycle: up, down, clean, status and path queries, on top of a backend and the lab directory."""
from __future__ import annotations

import ipaddress
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from labctl import paths, procs, state
from labctl.backends import backends, nsutil, rtnl
from labctl.errors import LabError, NotRootError
from labctl.plan.compile import compile_plan
from labctl.plan.model import LabPlan
from labctl.topology.load import load_topology, render_topology
from labctl.topology.yamlpos import load_yaml

OPERSTATE = {0: "unknown", 1: "notpresent", 2: "down", 3: "lowerlayerdown", 4: "testing", 5: "dormant",
             6: "up"}


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise NotRootError(what)


def up(file: str, sets=(), name: str | None = None, template_dirs=(), backend: str = "netns",
       progress=None) -> tuple[LabPlan, state.LabDir, float]:
    loaded = load_topology(file, sets, template_dirs, name)
    plan = compile_plan(loaded)
    require_root("labctl up")
    lab = state.claim(plan.lab, plan.to_dict(), str(Path(file).resolve()))
    t0 = time.perf_counter()
    kwargs = {"progress": progress} if progress else {}
    backends()[backend]().apply(plan, lab, **kwargs)
    try:
        start_controller(plan, lab)
        start_line(plan, lab)
    except BaseException:
        backends()[backend]().destroy(lab)
        raise
    elapsed = time.perf_counter() - t0
    from labctl.telemetry.ledger import softnet_drops
    lab.write_state(status="up", pid=None, backend=backend, build_seconds=round(elapsed, 3),
                    softnet_drops_at_up=softnet_drops())
    return plan, lab, elapsed


def start_controller(plan: LabPlan, lab: state.LabDir) -> int | None:
    """The data-plane controller (ECN marking from queue depths, PFC), if any class needs one."""
    from labctl.dataplane import controller
    if not controller.needed(plan):
        return None
    pid = _start_helper(lab, "labctl.dataplane.controller", "controller", "the data-plane controller")
    lab.write_state(controller_pid=pid)
    return pid


def start_line(plan: LabPlan, lab: state.LabDir) -> int | None:
    """The WAN line (delay, loss, jitter, ESP) for links that need one; fresh ESP keys first."""
    from labctl.backends import wires
    from labctl.wan.keys import write_keys
    if not wires.wired(plan):
        return None
    write_keys(plan, lab.path)
    pid = _start_helper(lab, "labctl.wan.line", "line", "the WAN line")
    lab.write_state(line_pid=pid)
    return pid


HELPER_RT_PRIORITY = procs.HELPER_RT_PRIORITY


def _start_helper(lab: state.LabDir, module: str, log_name: str, what: str) -> int:
    """A lab process in its own session, journaled before it can do anything; waits for "ready".

    The helpers stand in for switch hardware (PFC, marking, the WAN line), which never waits for
    the hosts' CPUs. At nice -10 the controller still slept up to tens of milliseconds behind two
    CPU-burning processes and a lossless queue overflowed its headroom; as a SCHED_FIFO process it
    runs as soon as it wakes. `-P` and a fixed working directory: a helper imports labctl from its
    install, never from whatever directory the user ran labctl in."""
    import subprocess
    import sys
    log = open(lab.path / f"{log_name}.log", "w")
    p = subprocess.Popen([sys.executable, "-P", "-m", module, str(lab.path)], cwd="/",
                         stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                         start_new_session=True)
    lab.journal("pid", procs.identity(p.pid))
    procs.prioritise(p.pid)
    line = p.stdout.readline()  # "ready" once it holds its sockets and rules
    if line.strip() != "ready":
        p.kill()
        raise LabError(f"{what} did not start: {(lab.path / f'{log_name}.log').read_text()[-500:]}")
    p.stdout.close()
    return p.pid


def find_lab(name_or_file: str) -> state.LabDir:
    """A lab by name, or by the topology file it was built from (the file need not exist for a name).

    Never by a path to its record: `down` deletes what it finds, so `labctl down /` or `down ..`
    must name nothing."""
    if state.valid_lab_name(name_or_file):
        lab = state.lab_dir(name_or_file)
        if lab.path.is_dir():
            return lab
    path = Path(name_or_file)
    if paths.is_file(path):
        text, smap, _ = render_topology(path)
        data, _ = load_yaml(text, smap.file)
        lab_name = data.get("name") if isinstance(data, dict) else None
        if state.valid_lab_name(lab_name) and state.lab_dir(lab_name).path.is_dir():
            return state.lab_dir(lab_name)
        raise LabError(f"the lab of {name_or_file} ({lab_name!r}) is not up",
                       f"`labctl up {name_or_file}` to build it; `labctl status` lists running labs")
    running = [d.name for d in state.all_labs()]
    what = "no lab named" if state.valid_lab_name(name_or_file) else "neither a lab name nor a topology file:"
    raise LabError(f"{what} {name_or_file!r}",
                   f"running labs: {', '.join(running)}" if running else "no lab is up; `labctl up FILE`")


def default_lab(name: str | None) -> state.LabDir:
    if name:
        return find_lab(name)
    labs = state.all_labs()
    if len(labs) == 1:
        return labs[0]
    if not labs:
        raise LabError("no lab is up", "`labctl up topologies/leaf-spine.yml`")
    raise LabError(f"{len(labs)} labs are up ({', '.join(d.name for d in labs)})", "say which with --lab NAME")


def down(name_or_file: str) -> list[str]:
    require_root("labctl down")
    lab = find_lab(name_or_file)
    backend = lab.read_state().get("backend", "netns")
    return backends()[backend]().destroy(lab)


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
    for lab in state.all_labs():
        st = lab.read_state()
        pid = st.get("pid")
        names = lab.namespaces()
        if st.get("status") == "building" and pid and nsutil.pid_alive(pid) and pid != os.getpid():
            continue  # still being built
        if st.get("status") == "building":
            reason = f"build interrupted (process {pid} is gone)"
        elif not any(nsutil.exists(n) for n in names):
            reason = "record of a lab whose namespaces are gone"
        elif everything:
            reason = "--all"
        else:
            continue
        removed = backends()[st.get("backend", "netns")]().destroy(lab)
        out.append(CleanResult(lab.name, reason, removed))
    return out


def load_plan(lab: state.LabDir) -> LabPlan:
    try:
        return LabPlan.from_dict(lab.read_plan())
    except (OSError, ValueError, KeyError) as exc:
        raise LabError(f"the record of lab {lab.name!r} is unreadable ({exc})",
                       "`labctl clean --all` removes it") from None


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
            ports.append({"name": i.name, "address": i.address, "peer": f"{i.peer_node}:{i.peer_iface}",
                          "fabric": i.fabric, "rate_bps": i.shaping.rate_bps,
                          "state": OPERSTATE.get(info.get("operstate"), "absent") if live else "unknown",
                          **{k: info.get(k) for k in rtnl.STATS_FIELDS if k in info}})
        nodes.append({"name": node.name, "kind": node.kind, "namespace": node.namespace, "present": present,
                      "loopback": node.loopback, "rank": node.rank, "interfaces": ports})
    return {"lab": plan.lab, "status": st.get("status"), "topology_file": st.get("topology_file"),
            "dilation": plan.dilation, "nodes": nodes, "helpers": helpers(lab)}


def helpers(lab: state.LabDir) -> list[dict]:
    """Each helper process the lab needs (controller, WAN line): running or not, and what it reports."""
    st = lab.read_state()
    journaled = {int(e.partition(":")[0]): e for e in lab.journaled("pid") if e.partition(":")[0].isdigit()}
    out = []
    for name, key, report in (("controller", "controller_pid", "pfc.json"), ("WAN line", "line_pid", "wan.json")):
        pid = st.get(key)
        if not pid:
            continue
        alive = pid in journaled and procs.verified(journaled[pid]) == pid
        try:
            doc = json.loads((lab.path / report).read_text())
        except (OSError, ValueError):
            doc = {}
        notes = []
        if "reaction_hist" in doc:
            from labctl.dataplane import reaction
            plan = load_plan(lab)
            notes.append(reaction.describe(reaction.summary(reaction.Histogram.from_list(doc["reaction_hist"]),
                                                            plan.pfc_response_s)))
        errors = doc.get("errors") or []
        if errors:
            notes.append(f"{len(errors)} refused change(s), last: {errors[-1]}")
        out.append({"helper": name, "pid": pid, "running": alive, "errors": errors,
                    "note": "; ".join(notes) if alive else f"NOT RUNNING: see {lab.path / (key.split('_')[0] + '.log')}"})
    return out


def node_address(plan: LabPlan, target: str) -> str:
    """An IP address, or a node name (its loopback, or for a host its first interface's address)."""
    try:
        return str(ipaddress.ip_address(target))
    except ValueError:
        pass
    try:
        node = plan.node(target.split(":")[0])
    except KeyError:
        raise LabError(f"{target!r} is neither an address nor a node of lab {plan.lab!r}",
                       "name a node (labctl status shows them) or give an IPv4 address") from None
    if ":" in target:
        return node.iface(target.split(":")[1]).address.split("/")[0]
    if node.loopback:
        return node.loopback.split("/")[0]
    return node.interfaces[0].address.split("/")[0]


def trace_path(plan: LabPlan, start: str, dest: str, sport: int | None, dport: int | None,
               proto: int = 17) -> list[dict]:
    """Hop by hop, ask each node's kernel where this flow goes (the ECMP hash with its 5-tuple)."""
    require_root("labctl route")
    dst = node_address(plan, dest)
    owner = {i.address.split("/")[0]: (n, i) for n in plan.nodes for i in n.interfaces}
    owner.update({n.loopback.split("/")[0]: (n, None) for n in plan.nodes if n.loopback})
    node = plan.node(start)
    src = None
    iif = None
    hops = []
    for _ in range(64):
        if dst in owner and owner[dst][0].name == node.name:
            hops.append({"node": node.name, "out": None, "via": None})
            return hops
        with nsutil.entered(node.namespace):
            sock = rtnl.open_socket()
        try:
            got = rtnl.route_get(sock, dst, src=src, iif=iif, proto=proto, sport=sport, dport=dport)
        except rtnl.NetlinkError as exc:
            raise LabError(f"{node.name} cannot route to {dst}: {os.strerror(exc.code)}") from None
        finally:
            sock.close()
        out = next((i for i in node.interfaces if i.index == got.get("oif")), None)
        if out is None:
            raise LabError(f"{node.name} has no route toward {dst}")
        if src is None:
            # the host's own lookup once more with its source address: the L4 hash includes it
            src = out.address.split("/")[0]
            continue
        hops.append({"node": node.name, "out": out.name, "via": got.get("gateway")})
        nxt = plan.node(out.peer_node)
        iif = nxt.iface(out.peer_iface).index
        node = nxt
    raise LabError(f"no path from {start} to {dest} within 64 hops (a routing loop?)")


def set_link_state(lab: state.LabDir, plan: LabPlan, node, iface: str, up: bool) -> int:
    """Cut or restore a link (both ends) and reconverge every node's routes, as BGP would.

    Routes are static in a lab, so without this the other switches would keep hashing flows
    toward the dead link. Returns how many routes changed.
    """
    from labctl.backends import netns as backend
    from labctl.plan.compile import routes_without
    port = node.iface(iface)
    peer = plan.node(port.peer_node)
    st = lab.read_state()
    down = set(st.get("links_down", []))
    old = routes_without(plan, down)
    down = down - {port.link} if up else down | {port.link}
    for n, i in ((node, port), (peer, peer.iface(port.peer_iface))):
        backend.set_link(n, i, up)
    new = routes_without(plan, down)
    changed = sum(backend.apply_routes(n, old[n.name], new[n.name]) for n in plan.nodes if old[n.name] != new[n.name])
    lab.write_state(links_down=sorted(down))
    return changed


def plan_json(plan: LabPlan) -> str:
    return json.dumps(plan.to_dict(), indent=1)


def pingall(plan: LabPlan, fabric: str | None = None, kinds=("gpu", "storage", "host"),
            parallel: int = 64) -> tuple[int, list[tuple[str, str]]]:
    """Ping every host from every other host over each fabric they share (Mininet's pingall).

    Returns the number of pairs tried and the pairs that failed. Pings run `parallel` at a time.
    """
    import subprocess
    require_root("labctl pingall")
    pairs = []
    for f in plan.fabrics:
        if fabric and f != fabric:
            continue
        members = [(n, i) for n in plan.nodes if n.kind in kinds for i in n.interfaces if i.fabric == f]
        if plan.fabrics[f].kind == "scale-up":  # islands: only GPUs of one server reach each other
            pairs += [(a, b, bi) for a, _ in members for b, bi in members
                      if a.name != b.name and a.server == b.server]
        else:
            pairs += [(a, b, bi) for a, _ in members for b, bi in members if a.name != b.name]
    failed = []
    for start in range(0, len(pairs), parallel):
        procs = [(a, b, subprocess.Popen(["ip", "netns", "exec", a.namespace, "ping", "-n", "-q", "-c", "1",
                                          "-W", "2", bi.address.split("/")[0]],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                 for a, b, bi in pairs[start:start + parallel]]
        failed += [(a.name, b.name) for a, b, p in procs if p.wait() != 0]
    return len(pairs), failed
