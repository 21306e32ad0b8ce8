"""Lab nodes in Docker containers, cabled by labctl like any namespace.

A container node starts with `network_mode: none` (only its loopback) and the least a router or
host needs: Docker's default capabilities plus NET_ADMIN (routing daemons configure their own
netns: addresses, routes, socket buffers; an FRR image also SYS_ADMIN, without which zebra
exits), Docker's default seccomp and AppArmor profiles, and of
/proc/sys only the network namespace's own part writable (net.*: ip_forward and the like belong
to the node; kernel.*, vm.*, fs.* belong to the host and stay read-only), and no_new_privs (a
setuid binary in the image raises nothing). A default capability this process does not hold is
never asked for (runc refuses one missing from the bounding set).

A lab file may ask for more, as powerful lines (plan/trust.py): `cap_add:` capabilities on top of
that set, or `privileged: true`, Docker's privileged mode (every capability and device, no
seccomp, AppArmor or read-only paths). Only a node that asks gets either; one this process cannot
grant (privileged where root lacks any capability) is refused before anything is made. It is
labelled with its lab and node. Its network namespace is then exposed as the named netns `<lab>-<node>` (a bind mount of
/proc/PID/ns/net, what `ip netns attach` makes, done by the backend), so the backend creates its veths in it, and the
controller, agents, captures and `ip netns exec` find it where they find every node.

Removal is by the lab's journal, never by a name pattern: a container is removed only if the
journal lists it and its labels say it belongs to this lab.
"""
from __future__ import annotations

import os
import re
import shutil

from labctl.capabilities import CAPABILITIES, FRR_EXTRA, held, is_frr, lacking  # noqa: F401 (CAPABILITIES: tests)
from labctl.containers import engine, images
from labctl.errors import LabError
from labctl.plan.model import Node
from labctl.plan.share import AGENT_CODE, AGENT_HOME  # a switch agent inside the node: its code and directory
from labctl.state import LabDir

CONTAINER_ID = re.compile(r"[0-9a-f]{64}")      # what Docker names a container by, whatever its name

LAB_LABEL = "labctl.lab"
NODE_LABEL = "labctl.node"
# Docker's default set, and NET_ADMIN: what FRR and a Linux host's tools need in their own netns
NODE_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
                     "NET_BIND_SERVICE", "NET_RAW", "SYS_CHROOT", "MKNOD", "AUDIT_WRITE", "SETFCAP", "NET_ADMIN")
ENV = "/usr/bin/env"                 # never the first `env` on PATH: labctl runs as root
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Docker's read-only /proc paths, with /proc/sys narrowed to what is not the node's own netns
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sysrq-trigger", "/proc/sys/kernel", "/proc/sys/vm",
                  "/proc/sys/fs", "/proc/sys/dev", "/proc/sys/user", "/proc/sys/debug", "/proc/sys/abi",
                  "/proc/sys/crypto"]
# a container that is not privileged runs with no_new_privs: a setuid binary or file capability in
# its image cannot raise a process above what the container holds (FRR and the host image's tools
# need no such raise: tests/test_netns_trust.py runs both with it)
NO_NEW_PRIVILEGES = "no-new-privileges"


def start(client, node: Node, lab: LabDir) -> int:
    """Create and start the node's container; returns its init PID (whose netns is the node's)."""
    c = node.container
    docker = engine.sdk()
    try:
        client.images.get(c.image)
    except docker.errors.ImageNotFound:
        # (up checks every image before the first container: this is for one removed meanwhile)
        raise LabError(f"node {node.name}: image {c.image!r} is not in the Docker engine, and no registry is used",
                       images.missing_fix(c.image)) from None
    can_grant(node)
    binds = binds_for(lab, node)
    lab.journal("container", c.name)
    api = client.api
    host = host_config(api, c, binds)
    try:
        made = api.create_container(c.image, command=c.cmd, name=c.name, hostname=node.name, environment=c.env,
                                    labels={LAB_LABEL: lab.name, NODE_LABEL: node.name}, host_config=host)
        api.start(made["Id"])
    except docker.errors.APIError as exc:
        raise LabError(f"node {node.name}: Docker could not start {c.image!r}: {exc.explanation or exc}",
                       "check the image's command (cmd:) and binds:") from None
    ctr = client.containers.get(made["Id"])
    ctr.reload()
    pid = ctr.attrs["State"]["Pid"]
    if not ctr.attrs["State"]["Running"] or not pid:
        logs = last_output(ctr.logs(tail=5, stream=True, follow=False)).strip()
        raise LabError(f"node {node.name}: container {c.name} exited at once "
                       f"(status {ctr.attrs['State']['ExitCode']}): {logs[-300:] or 'no output'}",
                       "give it a command that keeps running, e.g. `cmd: sleep infinity`")
    return pid


def last_output(chunks, kept: int = 4096) -> str:
    """The last `kept` bytes of a stream of output chunks, never more held: a line may be any length."""
    tail = bytearray()
    for chunk in chunks:
        tail = (tail + chunk)[-kept:]
    return tail.decode(errors="replace")


def host_config(api, c, binds: list[str]) -> dict:
    """Docker's HostConfig for the container: privileged only if the lab asked, else the node set
    of capabilities plus its cap_add, no_new_privs and the read-only /proc paths."""
    if c.privileged:
        # Docker decides the rest: every capability, device and /proc path, no seccomp or AppArmor
        return api.create_host_config(network_mode="none", privileged=True, binds=binds or None)
    host = api.create_host_config(network_mode="none", cap_drop=["ALL"], cap_add=node_capabilities(c.image, c.cap_add),
                                  binds=binds or None, security_opt=[NO_NEW_PRIVILEGES])
    host["ReadonlyPaths"] = READONLY_PATHS
    return host


def binds_for(lab: LabDir, node: Node) -> list[str]:
    """Everything bound into the node's container: the lab file's binds, its planned files, and
    its switch agent's code and directory if the agent runs inside."""
    binds = node.container.binds + _written_files(lab, node) + (agent_binds(lab, node) if agent_inside(node) else [])
    _adopt_carried_agent(lab, node, node.container.binds)
    return binds


def _written_files(lab: LabDir, node: Node) -> list[str]:
    """The node's planned files, written into the lab directory (so `down` takes them along), as
    read-only binds. Named by their order, never by their path: a path cannot aim the write elsewhere."""
    if not node.container.files:
        return []
    folder = lab.path / "files" / node.name
    folder.mkdir(parents=True, exist_ok=True)
    binds = []
    for k, f in enumerate(node.container.files):
        host = folder / str(k)
        host.write_text(f["text"])
        host.chmod(0o644)      # daemons in the container read it as their own user (frr)
        binds.append(f"{host}:{f['path']}:ro")
    return binds




def agent_inside(node: Node) -> bool:
    """Whether the node's switch agent runs inside its container: agents are placed in the nodes
    (LABCTL_SWITCH_AGENTS=node), the node needs one, and the container holds what it needs. A host
    only obeys pauses (netlink and packet sockets: NET_ADMIN, NET_RAW); a switch also loads BPF
    programs and maps, which this engine gives only with SYS_ADMIN (Docker 20.10 knows no
    CAP_BPF): an FRR node has it, another switch's agent runs from the host in its namespace."""
    from labctl.plan import share
    c = node.container
    # a node placed on a machine (plan/placement.py) always runs its own: no agent on this host reaches it
    if c is None or (share.placement() != "node" and node.machine is None) or not share.needs_agent(node):
        return False
    return not node.switching or c.privileged or "SYS_ADMIN" in node_capabilities(c.image, c.cap_add)


def agent_binds(lab: LabDir, node: Node) -> list[str]:
    """labctl's own package, read-only, and the node's agent directory (its share, control and
    report: nothing else of the lab's record), read-write."""
    import labctl
    from labctl.state import agent_directory
    home = agent_directory(lab.path, node.name)
    home.mkdir(parents=True, exist_ok=True)
    code = os.path.dirname(os.path.abspath(labctl.__file__))
    return [f"{code}:{AGENT_CODE}/labctl:ro", f"{home}:{AGENT_HOME}"]


def carries_agent(node: Node) -> bool:
    """Whether the node binds a directory of its own at AGENT_HOME: its exec lines start the agent
    a containerlab export carries (exports/clab.py)."""
    return bool(node.container) and any(b.partition(":")[2].split(":")[0] == AGENT_HOME for b in node.container.binds)


def _adopt_carried_agent(lab: LabDir, node: Node, binds: list[str]) -> None:
    """A node that binds a directory of its own at AGENT_HOME runs the agent a containerlab export
    carries (exports/clab.py): the lab's agents/NODE becomes a link to that directory, so that its
    report is read, and `tc set` written, where labctl reads and writes every agent's."""
    from labctl.state import agent_directory
    for bind in binds:
        host, _, rest = bind.partition(":")
        if rest.split(":")[0] == AGENT_HOME and os.path.isdir(host):
            link = agent_directory(lab.path, node.name)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists() and not link.is_symlink():
                link.symlink_to(host, target_is_directory=True)


def capabilities() -> list[str]:
    """The capabilities in this process's bounding set, by name (what a container may be given)."""
    return held()


def can_grant(node: Node) -> None:
    """Refuse, before anything is made, a container this process cannot give what the lab asked:
    runc fails a capability missing from its creator's bounding set, and a privileged container
    asks for every one. Never silently less than the lab file says."""
    c = node.container
    if c.privileged and lacking():
        raise LabError(f"node {node.name}: a privileged container needs every capability, and labctl's root here "
                       f"lacks {', '.join(lacking())} (runc would fail it: unable to apply caps)",
                       "run the lab where root holds every capability (not in a restricted container or VM "
                       "sandbox), or give the node only what it needs with cap_add: [...]")
    missing = [cap for cap in c.cap_add if cap not in held()]
    if missing:
        raise LabError(f"node {node.name}: cap_add asks for {', '.join(missing)}, which labctl's root here does not "
                       "hold (runc cannot give a container a capability its creator lacks)",
                       "remove it from cap_add:, or run the lab where root holds it")


def enter_argv(ctr, engine_url: str, argv: list[str], interactive: bool = False) -> list[str]:
    """A command line that runs `argv` in the container through its engine (`docker exec`): the
    engine enters the container with its namespaces, root, environment, cgroup, capabilities,
    seccomp profile and no_new_privs, before anything of the container's runs. Nothing of the
    container's may run earlier: its files are its author's (an image's `setpriv` or `sh` run by
    nsenter, which enters with every capability of the host's root, ran the author's code as root
    on the host), and neither may its environment reach a process of the host's (LD_PRELOAD)."""
    if not (ctr and ctr.attrs["State"].get("Running")):
        raise LabError(f"container {ctr.name if ctr else ''} is not running".replace("  ", " "),
                       "`labctl status` shows the lab; `labctl down` and up again")
    flags = ["-i"] if interactive else []
    if interactive and os.isatty(0) and os.isatty(1):
        flags.append("-t")
    # by its ID, never its name: the engine says what the name is, and "--env-file=/root/x" is one
    if not CONTAINER_ID.fullmatch(str(ctr.id)):
        raise LabError(f"the engine names container {str(ctr.name)[:80]!r} with ID {str(ctr.id)[:80]!r}, which is "
                       "not a container ID", "is the engine Docker's? (`labctl doctor`)")
    return [shutil.which("docker", path=SYSTEM_PATH) or "/usr/bin/docker", "-H", engine_url, "exec", *flags,
            ctr.id, *argv]


def node_capabilities(image: str, extra: list[str] = ()) -> list[str]:
    """What a container node that is not privileged holds: NODE_CAPABILITIES (and SYS_ADMIN for
    FRR, whose zebra will not start without it: it asks for net_admin, net_raw and sys_admin), and
    the lab's cap_add (`extra`), less any this process lacks."""
    have = set(held())
    wanted = dict.fromkeys(NODE_CAPABILITIES + (FRR_EXTRA if is_frr(image) else ()) + tuple(extra))
    return [c for c in wanted if c in have]


def exec_pid(ctr, marker: str) -> int | None:
    """This host's PID of the newest process in the container (its PID namespace) whose command line
    holds `marker`: a process `docker exec` started is the engine's child, not ours."""
    try:
        pidns = os.stat(f"/proc/{int(ctr.attrs['State']['Pid'])}/ns/pid").st_ino
    except (OSError, KeyError, TypeError, ValueError):
        return None
    if pidns == os.stat("/proc/self/ns/pid").st_ino:
        return None          # a container has a PID namespace of its own: never search the host's
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != pidns:
                continue
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:
            continue
    from labctl import procs
    return max(found, key=lambda p: procs.start_time(p) or 0, default=None)


def _container(client, name: str):
    try:
        return client.containers.get(name)
    except engine.sdk().errors.NotFound:
        return None


def remove(lab: LabDir) -> list[str]:
    """Remove the containers the journal lists that are this lab's; returns their names."""
    names = lab.journaled("container")
    if not names:
        return []
    if not engine.answering():
        if shutil.which("dockerd") is None:
            return []
        # the engine died (a reboot): its stopped containers are still in its store, so start it
        # to remove them; the caller's release_if_idle stops it again
        engine.ensure(auto=True).close()
    client = engine.client()
    docker = engine.sdk()
    removed = []
    try:
        for name in names:
            try:
                ctr = client.containers.get(name)
            except docker.errors.NotFound:
                continue
            if ctr.labels.get(LAB_LABEL) != lab.name:
                continue     # not ours: a container that took the name after ours was gone
            ctr.remove(force=True, v=True)
            removed.append(name)
    finally:
        client.close()
    return removed


def labs_with_containers(labs: list[LabDir], but: str | None = None) -> bool:
    """Does any lab other than `but` still journal a container?"""
    return any(lab.journaled("container") for lab in labs if lab.name != but)
