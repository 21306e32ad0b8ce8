"""Placed nodes as Swarm services: one service per node, pinned to its machine.

A service is how Swarm runs a container on a chosen machine: one replica, the constraint
`node.labels.labctl.machine == M`, no restart (a restarted task would come back in a fresh
namespace, without its links). The machines' engines run with no bridge (cluster/emulate.py, and
the README's recipe for real machines), so a task starts with only its loopback, as a
`network_mode: none` container does, and labctl cables it.

What a service cannot be given, Docker's Swarm never gives: `privileged` (refused at plan time,
topology/placement.py), no_new_privs and labctl's narrowed read-only /proc paths (a task keeps
Docker's defaults: all of /proc/sys read-only; labctl sets the node's sysctls from outside).

Removal is by the lab's journal and labels, as for containers (containers/nodes.py): a service is
removed only if the journal lists it and its labels say it is this lab's. Swarm then removes the
task's container on its machine; a machine away at the time does it when it comes back.
"""
from __future__ import annotations

import time

from labctl.errors import LabError
from labctl.names import terminal_safe

START_TIMEOUT_S = 120
STOP_GRACE_NS = 200_000_000


def constraint(machine: str) -> str:
    from labctl.cluster.machines import MACHINE_LABEL
    return f"node.labels.{MACHINE_LABEL}=={machine}"


def spec(node, lab, binds: list[str]):
    """The service's task template: the node's container as containers/nodes.py would start it."""
    from labctl.containers import engine, nodes
    types = engine.sdk().types
    c = node.container
    mounts = []
    for bind in binds:
        host, target, *mode = bind.split(":")
        mounts.append(types.Mount(target, host, type="bind", read_only=bool(mode) and mode[0] == "ro"))
    caps = [f"CAP_{cap}" for cap in nodes.node_capabilities(c.image, c.cap_add)]
    container = types.ContainerSpec(c.image, args=c.cmd, hostname=node.name, env=dict(c.env) or None,
                                    labels={nodes.LAB_LABEL: lab.name, nodes.NODE_LABEL: node.name},
                                    mounts=mounts or None, cap_drop=["ALL"], cap_add=caps,
                                    # `down` removes a node at once, as `docker rm -f` does a container
                                    stop_grace_period=STOP_GRACE_NS)
    return types.TaskTemplate(container, restart_policy=types.RestartPolicy(condition="none"),
                              placement=types.Placement(constraints=[constraint(node.machine)]))


def start(plan, lab, machines: dict, binds_of, progress=None) -> dict[str, tuple[int, tuple[int, int]]]:
    """Create every placed node's service (journaled first), wait until each task runs on its
    machine, and return each node's container PID (its netns is the node's) with the identity of
    that namespace as checked (verified)."""
    from labctl.cluster import machines as cluster
    from labctl.containers import nodes
    manager = cluster.client(cluster.manager(machines))
    clients = {}
    try:
        placed = [n for n in plan.nodes if n.machine]
        for i, node in enumerate(placed):
            lab.journal("service", node.container.name)
            try:
                manager.api.create_service(spec(node, lab, binds_of(node)), name=node.container.name,
                                           labels={nodes.LAB_LABEL: lab.name, nodes.NODE_LABEL: node.name})
            except Exception as exc:      # the SDK's APIError, or requests' errors
                raise LabError(f"node {node.name}: Swarm refused its service: {getattr(exc, 'explanation', exc)}",
                               "`labctl cluster status`; `docker service ls` on the manager") from None
            if progress:
                progress("services", i + 1, len(placed))
        pids = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        for i, node in enumerate(placed):
            machine = machines[node.machine]
            if machine.name not in clients:
                clients[machine.name] = cluster.client(machine)
            pids[node.name] = _task_pid(manager, clients[machine.name], node, deadline)
            if progress:
                progress("containers", i + 1, len(placed))
        return pids
    finally:
        manager.close()
        for c in clients.values():
            c.close()


def _task_pid(manager, engine_client, node, deadline: float) -> tuple[int, tuple[int, int]]:
    """The PID of the node's task container on its machine, once it runs, checked to be that
    container's own process in a namespace of its own (verified_pid)."""
    name = node.container.name
    while True:
        tasks = manager.api.tasks(filters={"service": name})
        states = [t["Status"]["State"] for t in tasks]
        failed = [t for t in tasks if t["Status"]["State"] in ("failed", "rejected", "shutdown", "complete")]
        if failed:
            err = failed[0]["Status"].get("Err") or failed[0]["Status"].get("Message") or failed[0]["Status"]["State"]
            raise LabError(f"node {node.name}: its container did not start on machine {node.machine}: {err}",
                           f"is its image {node.container.image!r} on that machine? (`labctl cluster status`)")
        running = [t for t in tasks if t["Status"]["State"] == "running"]
        cid = ((running[0]["Status"].get("ContainerStatus") or {}).get("ContainerID")) if running else None
        if cid:
            return verified(engine_client, cid, node)
        if time.monotonic() > deadline:
            raise LabError(f"node {node.name}: its task is {', '.join(states) or 'not scheduled'} after "
                           f"{START_TIMEOUT_S} s (machine {node.machine})",
                           "`labctl cluster status`: is the machine Ready and labelled?")
        time.sleep(0.1)


def verified_pid(engine_client, container_id: str, node) -> int:
    """verified(...)'s PID."""
    return verified(engine_client, container_id, node)[0]


def verified(engine_client, container_id: str, node) -> tuple[int, tuple[int, int]]:
    """The container's init PID as its machine's engine reports it, believed only if this kernel
    agrees: the ID is a container ID, the process sits in that container's own cgroup (a path
    component, not a substring: an ID of "0" is in every cgroup file), in a PID namespace of its
    own, and in a network namespace that is neither this host's, nor the machine's, nor one bound
    under another name (another lab's node). The node's namespace is bound, cabled, and at `down`
    emptied of processes: a PID an engine got wrong, or lied about, must never make that the host's
    or another lab's."""
    import os
    from labctl.cluster import machines
    from labctl.containers.nodes import CONTAINER_ID
    from labctl.kernel import nsutil
    if not isinstance(container_id, str) or not CONTAINER_ID.fullmatch(container_id):
        raise LabError(f"node {node.name}: its engine on machine {node.machine} names its container "
                       f"{str(container_id)[:80]!r}, which is not a container ID",
                       "is that machine's engine Docker's? (`labctl cluster status`)")
    attrs = engine_client.api.inspect_container(container_id)
    pid = attrs["State"]["Pid"]
    why = None
    try:
        pid = int(pid)
        cgroups = open(f"/proc/{pid}/cgroup").read() if pid > 0 else ""
        st = os.stat(f"/proc/{pid}/ns/net") if pid > 0 else None
        netns = (st.st_dev, st.st_ino) if st else None
        pidns = os.stat(f"/proc/{pid}/ns/pid").st_ino if pid > 0 else None
    except (OSError, ValueError, TypeError):
        pid, cgroups, netns, pidns = 0, "", None, None
    own_cgroup = {container_id, f"docker-{container_id}.scope"}
    in_cgroup = any(own_cgroup & set(line.split(":", 2)[-1].split("/")) for line in cgroups.splitlines())
    if not pid or attrs.get("Id") != container_id or not in_cgroup:
        why = f"PID {pid} is not in container {container_id[:12]}'s cgroup on this kernel"
    elif netns == _ns("/proc/self/ns/net"):
        why = f"PID {pid}'s network namespace is this host's"
    elif pidns == os.stat("/proc/self/ns/pid").st_ino:
        why = f"PID {pid} is in this host's PID namespace, not a container's"
    else:
        machine = machines.load().get(node.machine)
        other = nsutil.bound_as(netns, but=node.namespace)
        if machine is not None and machine.netns and netns == _ns(nsutil.path(machine.netns)):
            why = f"PID {pid}'s network namespace is machine {machine.name}'s own"
        elif other:
            why = f"PID {pid}'s network namespace is {other}'s, bound by another lab or tool"
    if why:
        raise LabError(f"node {node.name}: its engine on machine {node.machine} reports a container labctl cannot "
                       f"vouch for ({why})", "is that machine's engine on this host's kernel? "
                       "(`labctl cluster status`)")
    return pid, netns     # the namespace's identity: bound only if it is still this one (nsutil.attach)


def _ns(path) -> tuple[int, int]:
    import os
    st = os.stat(path)
    return st.st_dev, st.st_ino


def remove(lab) -> list[str]:
    """Remove the journaled services that are this lab's, and wait until their containers are gone
    from every machine that answers (one that does not is named: Swarm removes its containers when
    it comes back). Returns the services that could not be removed (the manager did not answer, or
    refused): the caller keeps the lab's record, so that `down` can be run again."""
    names = lab.journaled("service")
    if not names:
        return []
    from labctl.cluster import machines as cluster
    from labctl.containers import nodes
    import sys
    try:
        known = cluster.load()
        manager = cluster.client(cluster.manager(known), timeout=30)
    except LabError as exc:
        print(f"labctl: lab {lab.name}: its services cannot be removed now: {terminal_safe(str(exc))}",
              file=sys.stderr)
        return names
    left = []
    try:
        for name in names:
            try:
                for svc in manager.services.list(filters={"name": name}):
                    if svc.name == name and (svc.attrs["Spec"].get("Labels") or {}).get(nodes.LAB_LABEL) == lab.name:
                        svc.remove()
            except Exception as exc:      # the SDK's APIError, or the connection lost: try the rest
                said = terminal_safe(str(getattr(exc, "explanation", exc)))     # the manager's words
                print(f"labctl: lab {lab.name}: service {name} not removed: {said}", file=sys.stderr)
                left.append(name)
    finally:
        manager.close()
    _wait_gone(lab, known, set(names) - set(left))
    return left


def refuse_while_placed(what: str, machine: str | None = None) -> None:
    """`cluster leave/reset` and `emulate --stop` take machines away: never under a lab that has
    nodes on them (its services are in its journal; `down` needs the machines to remove them)."""
    from labctl.state import all_labs
    placed = [lab.name for lab in all_labs() if lab.journaled("service")
              and (machine is None or _places_on(lab, machine))]
    if placed:
        raise LabError(f"{what}: lab(s) {', '.join(placed)} run nodes on "
                       + (f"machine {machine}" if machine else "these machines"),
                       f"`labctl down {placed[0]}` first")


def _places_on(lab, machine: str) -> bool:
    try:
        from labctl.plan.model import LabPlan
        return any(n.machine == machine for n in LabPlan.from_lab_dir(lab.path).nodes)
    except (OSError, ValueError, KeyError):
        return True            # a record that cannot be read: assume it does


def _wait_gone(lab, known: dict, names: set[str], timeout: float = 60) -> None:
    import sys
    from labctl.cluster import machines as cluster
    deadline = time.monotonic() + timeout
    for machine in known.values():
        try:
            c = cluster.client(machine, timeout=10)
        except LabError:
            print(f"labctl: machine {machine.name} does not answer: Swarm removes lab {lab.name}'s containers "
                  "there when it comes back", file=sys.stderr)
            continue
        try:
            while time.monotonic() < deadline:
                # the engine's list as it stands (a container removed meanwhile is not looked up again)
                left = [x for x in c.api.containers(all=True, filters={"label": f"labctl.lab={lab.name}"})
                        if (x.get("Labels") or {}).get("com.docker.swarm.service.name") in names]
                if not left:
                    break
                time.sleep(0.2)
        finally:
            c.close()
