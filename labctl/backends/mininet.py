"""The Mininet backend: Mininet builds the nodes and links, labctl configures them as it does its own.

`labctl up FILE --backend mininet`. A helper under the system Python (mininet_net.py; Debian's
mininet imports only there) creates every node as a Mininet Node in its own namespace and every
link as a Mininet Link with the plan's port names and MACs, then holds the network. Each node's
namespace is exposed as the named netns `<lab>-<node>` (`ip netns attach`), so from there on
everything is the same as with the netns backend: sysctls, flow steering, addresses, HTB classes,
routes and nftables classification go in over netlink (netconf.py), and the controller, agents,
captures and sampler find each node where they always do. Mininet picks the ifindexes, so the
lab's plan.json is rewritten with the real ones before any helper reads it.

`down` asks the helper to stop (net.stop()), then removes what is left exactly as the netns backend
does. `mn -c` is never run: it kills and deletes machine-wide.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from labctl import helpers, procs
from labctl.kernel import neighbours, netconf, nsutil, rps, rtnl, wires
from labctl.backends.base import Progress, quiet, refuse_taken_namespaces
from labctl.backends.netns import NetnsBackend
from labctl.errors import LabError
from labctl.plan.model import LabPlan
from labctl.state import LabDir

SYSTEM_PYTHON = "/usr/bin/python3"
SCRIPT = Path(__file__).with_name("mininet_net.py")


def available() -> str | None:
    """None if Mininet can build here, else why not."""
    if not shutil.which("mnexec"):
        return "mnexec is missing (it comes with Debian's mininet package)"
    # -P and cwd=/: a mininet/ folder where the user stands is never what this imports (as root)
    r = subprocess.run([SYSTEM_PYTHON, "-P", "-c", "import mininet.net"], capture_output=True, text=True, cwd="/")
    if r.returncode != 0:
        return f"{SYSTEM_PYTHON} cannot import mininet"
    return None


class MininetBackend(NetnsBackend):
    name = "mininet"
    description = "Mininet's Python API builds the nodes and links; labctl configures them"

    def available(self) -> str | None:
        why = available()
        return f"{why}; `sudo ./install.sh` installs Mininet (apt: mininet bridge-utils iputils-ping)" if why else None

    def check(self, plan: LabPlan) -> list[tuple[str, str, str]]:
        wrong = []
        if wires.wired(plan):
            wrong.append(("links", "the mininet backend has no WAN line: links with a delay, loss, jitter or "
                          "encryption need the netns backend", "use --backend netns for this lab"))
        for n in plan.nodes:
            if n.container:
                wrong.append((f"nodes.{n.name}.image", f"the mininet backend builds no container nodes "
                              f"({n.name} has an image:)", "use --backend netns for this lab: it runs "
                              "containers beside namespaces"))
        return wrong

    def apply(self, plan: LabPlan, lab: LabDir, progress: Progress = quiet) -> None:
        why = available()
        if why:
            raise LabError(f"the mininet backend cannot run here: {why}",
                           "`sudo ./install.sh` installs Mininet (apt: mininet bridge-utils iputils-ping)")
        for _key, reason, fix in self.check(plan):
            raise LabError(reason, fix)
        procs.raise_fd_limit(3 * len(plan.nodes) + 64)
        refuse_taken_namespaces(plan)
        try:
            for node in plan.nodes:
                lab.journal("netns", node.namespace)
            self._start_mininet(plan, lab, progress)
            self._configure(plan, lab, progress)
        except BaseException:
            self.destroy(lab)
            raise

    def _start_mininet(self, plan: LabPlan, lab: LabDir, progress: Progress) -> None:
        spec = {"nodes": [{"name": n.name, "netns": n.namespace} for n in plan.nodes], "links": []}
        for lk in plan.links:
            (a, ia), (b, ib) = lk.ends
            spec["links"].append({"a": a, "a_if": ia, "a_mac": plan.node(a).iface(ia).mac,
                                  "b": b, "b_if": ib, "b_mac": plan.node(b).iface(ib).mac})
        log = open(lab.path / "mininet.log", "w")
        p = subprocess.Popen([SYSTEM_PYTHON, "-P", str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=log, text=True, cwd="/", start_new_session=True)
        lab.journal("pid", procs.identity(p.pid))
        lab.write_state(mininet_pid=p.pid)
        p.stdin.write(json.dumps(spec))
        p.stdin.close()
        progress("mininet", 0, len(plan.nodes))
        helpers.await_ready(p, "Mininet (building the lab)", lab.path / "mininet.log", tail=800)
        p.stdout.close()
        for node in plan.nodes:     # Mininet named them (`ip netns attach`): their identities, for `down`
            identity = nsutil.identity(node.namespace)
            if identity is None:
                raise LabError(f"Mininet did not make namespace {node.namespace}", f"see {lab.path / 'mininet.log'}")
            lab.noter(node.namespace)(identity)
        progress("mininet", len(plan.nodes), len(plan.nodes))

    def _configure(self, plan: LabPlan, lab: LabDir, progress: Progress) -> None:
        """What the netns backend does after its links exist, on Mininet's namespaces and ifindexes."""
        deadline = time.monotonic() + 30
        for k, node in enumerate(plan.nodes):
            with nsutil.entered(node.namespace):
                nsutil.write_sysctls(node.sysctls)
                nl = rtnl.open_socket()
                ioctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                real = rtnl.link_indexes(nl)
                for iface in node.interfaces:
                    iface.index = real[iface.name]        # Mininet's numbering, not the plan's
                extra = [(rtnl.set_mtu(i.index, i.mtu), f"{node.name}: mtu {i.name}") for i in node.interfaces]
                netconf.configure(node, nl, ioctl, neighbours.of_node(plan, node.name), extra_first=extra)
                netconf.wait_up(nl, node.namespace, {i.name for i in node.interfaces}, deadline)
            finally:
                nl.close()
                ioctl.close()
            rps.set_on_devices(str(nsutil.path(node.namespace)), [i.name for i in node.interfaces], rps.cpu_mask())
            progress("configure", k + 1, len(plan.nodes))
        lab.write_plan(plan.to_dict())   # the controller and agents read these indexes
        for node in plan.nodes:
            netconf.classify(node)

    def destroy(self, lab: LabDir, keep_record: bool = False) -> list[str]:
        """Let Mininet stop its network first (net.stop()), then remove what is left from the journal."""
        pid = lab.read_state().get("mininet_pid")
        entry = next((e for e in lab.journaled("pid") if e.partition(":")[0] == str(pid)), None)
        if pid and entry and procs.verified(entry) == pid:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while procs.verified(entry) == pid and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().destroy(lab, keep_record)
