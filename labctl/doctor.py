"""What this machine can do, and which mechanism each labctl feature uses on it (the kernel's
answers come from probe.py)."""
from __future__ import annotations

import os
import shutil

from labctl.probe import QDISCS, probe_kernel

TOOLS = (("tcpdump", "captures"), ("tshark", "decoding RoCE in captures"), ("dumpcap", "labctl capture"),
         ("ethtool", "NIC offloads by hand"), ("nft", "nftables (ECN marking)"), ("ip", "iproute2"),
         ("mn", "Mininet: --backend mininet, --topo import, export --format mininet, bench/bringup.py"),
         ("dockerd", "the Docker engine, for container nodes (image:)"),
         ("debootstrap", "labctl image build (node images from Debian packages)"),
         ("dot", "Graphviz, for labctl graph | dot"))


def features(k: dict[str, bool]) -> list[dict]:
    """The mechanism each feature uses on this machine, from what the kernel probes found."""
    def pick(native: str, portable: str, have_native: bool) -> str:
        return native if have_native else portable

    return [
        {"feature": "links", "mechanism": "veth pairs created in their namespaces (rtnetlink)",
         "status": "in use" if k.get("veth") else "MISSING: labctl cannot run"},
        {"feature": "shaping", "mechanism": "HTB class at the dilated link rate, burst 1 ms, bfifo leaf",
         "status": "in use" if k.get("htb") and k.get("bfifo") else "MISSING: labctl cannot shape"},
        _ecmp(k),
        _forwarding(),
        {"feature": "RoCEv2 traffic", "mechanism": "agents in GPU namespaces: UDP 4791 sockets, "
                                                  + ("GSO sends cut into frames at the host veth" if
                                                     k.get("udp_gso_no_csum", True) else
                                                     "one send per frame (before 6.11 the kernel refuses UDP "
                                                     "GSO from a port without checksum offload)")
                                                  + ", recvmmsg receivers",
         "status": "in use"},
        {"feature": "traffic classes", "mechanism": "HTB class + bfifo leaf per class on every port; DSCP to "
                                                   "class by nftables (meta priority) on switches, SO_PRIORITY "
                                                   "in agents" + ("" if not k.get("mqprio") else
                                                                  " (mqprio present, not needed)"),
         "status": "in use" if k.get("htb") and k.get("nftables") else "MISSING nftables"},
        _queue_reads(k),
        _ecn_marking(k),
        {"feature": "DCQCN", "mechanism": "CNPs from receiving agents (notification point), per-QP rate "
                                          "pacing in sending agents (reaction point)", "status": "in use"},
        {"feature": "PFC pause", "mechanism": "controller sends 802.1Qbb frames past XOFF; a paused port's "
                                              "lossless class is a TBF set to 8 bit/s, resumed with one kicked "
                                              "frame", "status": "in use" if k.get("tbf") else "MISSING tbf"},
        {"feature": "NVLink (scale-up) flow control", "mechanism": "credit-based backpressure modelled as "
                                                                   "hop-by-hop pause of the RoCE class on every "
                                                                   "NVLink port", "status": "in use"},
        _switch_agents(),
        _machines(),
        {"feature": "controller and WAN line scheduling",
         "mechanism": "SCHED_FIFO 10; rtnl readers (queue sampler, loss ledger) SCHED_FIFO 5 inside netlink calls"
         if k.get("sched_fifo", True) else "nice -10 (real-time refused here: a burst of CPU load can delay a "
                                           "pause; check each run's controller reaction)",
         "status": "in use"},
        {"feature": "flow order across hops", "mechanism": "receive packet steering by flow hash on every port: "
         + ("the namespace's net.core.rps_default_mask" if k.get("rps_default_mask", True)
            else "each port's rps_cpus in sysfs (no per-namespace default mask before kernel 6.5)"),
         "status": "in use"},
        {"feature": "loss ledger", "mechanism": "qdisc, device, per-CPU backlog (softnet_stat), ARP unresolved "
                                                "discards, IP and UDP socket, and WAN line counters before and "
                                                "after every run", "status": "in use"},
        {"feature": "neighbours", "mechanism": "permanent ARP entries for every port's peers, written at build "
                                               "time (no packet waits for ARP)", "status": "in use"},
        {"feature": "WAN delay, loss, jitter",
         "mechanism": ("the line process (labctl.wan.line): AF_PACKET between wire namespaces, frames held for "
                       "the delay in order" + ("; netem is present but not used, so every kernel runs the tested "
                                               "path" if k.get("netem") else " (no netem here)")),
         "status": "in use"},
        {"feature": "WAN encryption",
         "mechanism": ("user-space ESP tunnel (AES-GCM, RFC 4106) in the line; keys in the lab directory as "
                       "Wireshark esp_sa" + ("; kernel XFRM is present but not used" if k.get("esp")
                                             else " (no kernel ESP here)")),
         "status": "in use"},
        {"feature": "Mininet backend (--backend mininet)",
         "mechanism": "Mininet's Python API (system python3) builds nodes and links; labctl configures them",
         "status": _mininet_status()},
        {"feature": "container nodes (image:)",
         "mechanism": ("Docker containers with network_mode none, their netns named <lab>-<node> and cabled "
                       "like any node; dockerd started by labctl when none runs (iptables, bridge and "
                       "forwarding off)"),
         "status": _engine_status()},
        {"feature": "TCP flows (frontend)", "mechanism": "kernel TCP in the hosts' namespaces (cubic, reno or bbr "
                                                          "per flow), driven by threads of `labctl run`",
         "status": "in use"},
    ]


def _ecmp(k: dict[str, bool]) -> dict:
    from labctl.kernel import flowhash
    engine = flowhash.engine()
    forced = os.environ.get(flowhash.ENV, "auto") not in ("", "auto")
    why = f"{flowhash.ENV}={engine}" if forced else "this kernel has no fib_multipath_hash_seed"
    if engine == "bpf":
        return {"feature": "ECMP", "mechanism": "multipath routes placing each packet by labctl's seeded 5-tuple "
                                                "hash, set by a tc BPF program on every router port "
                                                f"(fib_multipath_hash_policy=1; {why}): the same draw on every "
                                                "boot and kernel", "status": "in use" if k.get("bpf_flow_hash", True)
                else f"FAILED: the program did not load here; set {flowhash.ENV}=kernel"}
    return {"feature": "ECMP", "mechanism": "multipath routes hashing "
                                            + ("each packet's 5-tuple (fib_multipath_hash_policy=3)" if
                                               k.get("hash_fields", True) else "L4 (policy 1: a local TCP "
                                               "socket's random hash picks its path)")
                                            + (", fixed seed" if k.get("hash_seed", True) else
                                               f", seed random per boot (no fib_multipath_hash_seed; {flowhash.ENV}"
                                               "=bpf fixes it)"),
            "status": "in use"}


def _forwarding() -> dict:
    from labctl.kernel import fastpath
    wanted = fastpath.mode()
    slow = ("the routers' IP stacks (ip_forward; DSCP to class and ECN marking in the nftables "
            "forward hook)")
    if wanted == "slow":
        return {"feature": "forwarding", "mechanism": f"{slow}; {fastpath.ENV}=slow", "status": "in use"}
    mechanism = ("fast path: a tc BPF program on each router port's ingress (bpf_fib_lookup, the class from "
                 "DSCP, ECN marking, TTL, out through the egress port's qdiscs); destinations with several "
                 "next hops (the kernel's hash picks), ICMP, IP options and fragments take " + slow +
                 "; routers with an lb: mode, te: marks, FRR or exec: lines keep the slow path")
    if fastpath.available():
        return {"feature": "forwarding", "mechanism": mechanism, "status": "in use"}
    return {"feature": "forwarding", "mechanism": slow,
            "status": "in use" if wanted == "auto" else f"FAILED: the program did not load here; unset {fastpath.ENV}"}


def _ecn_marking(k: dict[str, bool]) -> dict:
    from labctl.kernel import ecnpath
    wanted = ecnpath.mode()
    controller = ("the controller: it reads class backlogs (batched qdisc GETs) and switches nftables "
                  "`ip ecn set ce` rules (and the fast path's marking slots) between 16 levels of the profile"
                  + (" (RED present, not needed)" if k.get("red") else ""))
    if wanted == "controller":
        return {"feature": "ECN marking", "mechanism": f"{controller}; {ecnpath.ENV}=controller",
                "status": "in use" if k.get("nftables") else "MISSING nftables"}
    datapath = ("in the data path: a tc BPF program on each switch port's egress marks every ECT packet on the "
                "depth its class has as it arrives (what entered, less what a program on the link's far end saw "
                "leave); the controller only corrects that estimate from its reads. Ports whose far end labctl "
                "did not make fall back to " + controller)
    if ecnpath.available():
        return {"feature": "ECN marking", "mechanism": datapath, "status": "in use"}
    return {"feature": "ECN marking", "mechanism": controller,
            "status": "in use" if wanted == "auto" else f"FAILED: the programs did not load here; unset {ecnpath.ENV}"}


def lab_paths() -> list[dict]:
    """For each lab that is up: its routers on the fast path and on the slow path, read from the
    ports (the program attached or not), not from what `up` meant to do."""
    from labctl import state
    from labctl.kernel import fastmaps
    from labctl.lifecycle.labs import load_plan
    out = []
    for d in state.all_labs():
        try:
            plan = load_plan(d)
        except Exception as exc:         # a half-built or foreign record: say so, do not stop the report
            out.append({"lab": d.name, "error": str(exc)})
            continue
        fast, slow, marking = [], [], []
        for node in plan.nodes:
            if node.switching and any(c.ecn for i in node.interfaces for c in i.shaping.classes):
                try:
                    if _marks_in_data_path(node):
                        marking.append(node.name)
                except OSError:
                    pass
            if node.forwarding and not node.bridged:
                try:
                    (fast if fastmaps.forwarded(node) is not None else slow).append(node.name)
                except OSError:
                    slow.append(node.name)
        agents_in_nodes = sorted((d.read_state().get("agent_pids") or {}))
        out.append({"lab": d.name, "fast_path": fast, "slow_path": slow, "ecn_in_data_path": marking,
                    "agents_in_nodes": agents_in_nodes})
    return out


def _switch_agents() -> dict:
    from labctl.dataplane import agents
    try:
        placement = agents.mode()
    except Exception as exc:             # a bad LABCTL_SWITCH_AGENTS: say it here, `up` refuses it
        return {"feature": "switch agents (PFC, ECN profiles)", "mechanism": str(exc), "status": "MISCONFIGURED"}
    where = ("one agent on the host serves every node (LABCTL_SWITCH_AGENTS=node: one inside each node)"
             if placement == "lab" else
             "one agent inside each node that needs one, from its share of the plan (LABCTL_SWITCH_AGENTS=node)")
    return {"feature": "switch agents (PFC, ECN profiles)", "mechanism": where, "status": "in use"}


def _machines() -> dict:
    from labctl.cluster import machines
    feature = "labs across machines (placement:, --hosts)"
    try:
        known = machines.load()
    except Exception as exc:            # an unreadable record: say it here, `up` refuses it
        return {"feature": feature, "mechanism": str(exc), "status": "MISCONFIGURED"}
    how = ("each placed node a Swarm service pinned to its machine (node label labctl.machine); links between "
           "machines point-to-point VXLAN (UDP 14789), no bridge in the path, so pauses cross; the nodes' own "
           "switch agents")
    if not known:
        return {"feature": feature, "mechanism": how + "; no machines known (`labctl cluster emulate 3` or "
                "`labctl cluster init`)", "status": "not in use"}
    here = [m.name for m in known.values() if m.on_this_host]
    far = [m.name for m in known.values() if not m.on_this_host]
    return {"feature": feature, "mechanism": how + f"; machines on this host's kernel: {', '.join(here) or 'none'}"
            + (f"; on other hosts (labs not placed there yet): {', '.join(far)}" if far else ""), "status": "in use"}


def _marks_in_data_path(node) -> bool:
    from labctl.kernel import ecnpath, nsutil
    with nsutil.netlink_socket(node.namespace) as sock:
        queues = ecnpath.open_queues(sock, node)
    if queues is None:
        return False
    queues.close()
    return True


def _queue_reads(k: dict[str, bool]) -> dict:
    from labctl.dataplane import arrivals
    engine = arrivals.engine()
    have = k.get("arrival_counters", True)
    if engine == "poll" or (engine == "auto" and not have):
        why = f"{arrivals.ENV}=poll" if engine == "poll" else "the arrival counters did not load here"
        return {"feature": "controller queue reads", "mechanism": "every switch polled (1 kHz while a queue "
                "could reach a threshold, idle ones slower in a large lab, PFC headroom grown by that); " + why,
                "status": "in use"}
    return {"feature": "controller queue reads",
            "mechanism": "on arrivals: a tc BPF program on each controlled port's egress counts bytes per class "
                         "into a map the controller reads from memory; a switch is read (batched qdisc GETs) "
                         "only once what arrived could have filled a queue to Kmin or XOFF",
            "status": "in use" if have else f"FAILED: the counters did not load here; set {arrivals.ENV}=poll"}


def _mininet_status() -> str:
    from labctl import backends
    why = backends.available("mininet")
    return "available" if why is None else f"not available: {why}"


def _engine_status() -> str:
    from labctl.containers import engine, images
    st = engine.status()
    if not st["dockerd"] and not st["answering"]:
        return f"not available: dockerd is missing ({engine.INSTALL_HINT})"
    if not st["answering"]:
        return "available: no engine runs now; `labctl up` or `labctl engine start` starts dockerd"
    who = "started by labctl" if st["started_by_labctl"] else "not labctl's"
    have = [row["name"] for row in images.listing() if row["present"]]
    return (f"engine running (Docker {st.get('version')}, {who}); images built: "
            f"{', '.join(have) or 'none yet (labctl image build host)'}")


def run() -> dict:
    root = os.geteuid() == 0
    kernel = probe_kernel() if root else {}
    return {
        "root": root,
        "kernel": [{"name": n, "present": kernel.get(n, False),
                    "note": "" if root else "not probed (needs root)"}
                   for n in ("veth", *QDISCS, "nftables", "esp")],
        "tools": [{"name": t, "present": shutil.which(t) is not None, "note": why} for t, why in TOOLS],
        "features": features(kernel),
        "labs": lab_paths() if root else [],
    }
