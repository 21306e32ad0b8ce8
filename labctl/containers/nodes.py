"""Lab nodes in Docker containers, cabled by labctl like any namespace.

A container node starts with `network_mode: none` (only its loopback), with what containerlab's
`privileged` gives its linux nodes (routing daemons set sysctls and socket options): every
capability this process holds, /proc/sys writable, no seccomp or AppArmor profile. Docker's own
`privileged` asks for every capability it knows, and runc then fails on a machine whose root
lacks one (CAP_SYS_RESOURCE here), so the set is read from this process's bounding set. It is
labelled with its lab and node. Its network namespace is then exposed as the named netns `<lab>-<node>` (a bind mount of
/proc/PID/ns/net, what `ip netns attach` makes, done by the backend), so the backend creates its veths in it, and the
controller, agents, captures and `ip netns exec` find it where they find every node.

Removal is by the lab's journal, never by a name pattern: a container is removed only if the
journal lists it and its labels say it belongs to this lab.
"""
from __future__ import annotations

import shutil

from labctl.containers import engine
from labctl.errors import LabError
from labctl.plan.model import Node
from labctl.state import LabDir

LAB_LABEL = "labctl.lab"
NODE_LABEL = "labctl.node"
PRIVILEGED_OPTS = ["seccomp=unconfined", "apparmor=unconfined"]
# capability(7) numbers 0..37, in order; PERFMON, BPF and CHECKPOINT_RESTORE (38..40) are left
# out: Docker 20.10 refuses names it does not know
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ")


def start(client, node: Node, lab: LabDir) -> int:
    """Create and start the node's container; returns its init PID (whose netns is the node's)."""
    c = node.container
    docker = engine.sdk()
    try:
        client.images.get(c.image)
    except docker.errors.ImageNotFound:
        raise LabError(f"node {node.name}: image {c.image!r} is not in the Docker engine, and no registry is used",
                       "build one (`labctl image build host`, `labctl image build frr`), "
                       "or `docker pull` / `docker load` it first") from None
    binds = c.binds + _written_files(lab, node)
    lab.journal("container", c.name)
    api = client.api
    host = api.create_host_config(network_mode="none", cap_add=capabilities(), security_opt=PRIVILEGED_OPTS,
                                  binds=binds or None)
    host["MaskedPaths"], host["ReadonlyPaths"] = [], []     # /proc/sys writable: `--security-opt systempaths=unconfined`
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
        logs = ctr.logs(tail=5).decode(errors="replace").strip()
        raise LabError(f"node {node.name}: container {c.name} exited at once "
                       f"(status {ctr.attrs['State']['ExitCode']}): {logs[-300:] or 'no output'}",
                       "give it a command that keeps running, e.g. `cmd: sleep infinity`")
    return pid


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


def capabilities() -> list[str]:
    """The capabilities in this process's bounding set, by name (what a container may be given)."""
    with open("/proc/self/status") as f:
        mask = int(next(line.split()[1] for line in f if line.startswith("CapBnd:")), 16)
    return [name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1]


def enter_argv(client, name: str, argv: list[str]) -> list[str]:
    """A command line that runs `argv` in the container as `docker exec` would (its mount, UTS, IPC,
    net and PID namespaces, its root and working directory, and its environment: the image's ENV
    and the node's env:, so PATH is the container's), with nsenter: 3 ms where the engine takes 50,
    and an exported leaf-spine runs hundreds of exec lines."""
    ctr = _container(client, name)
    pid = ctr.attrs["State"]["Pid"] if ctr else None
    if not pid:
        raise LabError(f"container {name} is not running", "`labctl status` shows the lab; `labctl down` and up again")
    return ["env", "-i", *container_env(ctr.attrs), shutil.which("nsenter") or "/usr/bin/nsenter",
            "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--", *argv]


def container_env(attrs: dict) -> list[str]:
    """The environment `docker exec` gives a process: the container's Config.Env, with HOSTNAME and
    a HOME, and Docker's default PATH where the image sets none."""
    env = list(attrs["Config"].get("Env") or [])
    names = {e.split("=", 1)[0] for e in env}
    defaults = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOSTNAME": attrs["Config"].get("Hostname", ""), "HOME": "/root"}
    return env + [f"{k}={v}" for k, v in defaults.items() if k not in names]


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
        import shutil
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
