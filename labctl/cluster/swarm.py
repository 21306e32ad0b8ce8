"""The Docker Swarm that joins the machines, driven through the Docker SDK.

Swarm owns where a lab node's container runs: labctl labels each machine's Swarm node
`labctl.machine=NAME` and pins a node's service with `node.labels.labctl.machine==NAME`.
Its address pools are kept clear of 10.0.0.0/8 as far as Swarm allows (lab files use 10/8), and
its VXLAN data path keeps the default UDP port 4789: labctl's own cross-machine links use 14789.
"""
from __future__ import annotations

import time

from labctl.cluster.machines import MACHINE_LABEL, Machine, client
from labctl.errors import LabError
from labctl.names import terminal_safe

SWARM_PORT = 2377
DEFAULT_ADDR_POOL = ["10.200.0.0/16"]     # Swarm's own default is 10.0.0.0/8, where labs live
SUBNET_SIZE = 24
RESET_FIX = "`labctl cluster reset` makes every machine leave its Swarm and forgets them"


def _explain(exc: Exception) -> str:
    return str(getattr(exc, "explanation", None) or exc).strip()


def _fail(machine: Machine, what: str, exc: Exception, fix: str) -> LabError:
    return LabError(f"machine {machine.name} (engine {machine.engine}): {what} failed: {_explain(exc)}", fix)


def _state(c) -> dict:
    """The engine's own view of its Swarm membership (info()['Swarm'])."""
    return c.info().get("Swarm") or {}


def init(machine: Machine) -> str:
    """Form a new Swarm with `machine` as its first manager; returns its Swarm node ID."""
    c = client(machine)
    try:
        st = _state(c)
        if st.get("LocalNodeState", "inactive") != "inactive":
            raise LabError(f"machine {machine.name} (engine {machine.engine}) is already in a Swarm "
                           f"(node {st.get('NodeID') or '?'}, {st.get('LocalNodeState')})",
                           f"`docker -H {machine.engine} swarm leave --force` if it is no Swarm of yours; "
                           + RESET_FIX)
        try:
            return c.swarm.init(advertise_addr=machine.address, listen_addr=f"{machine.address}:{SWARM_PORT}",
                                default_addr_pool=DEFAULT_ADDR_POOL, subnet_size=SUBNET_SIZE)
        except Exception as exc:    # APIError, or the connection's own errors
            raise _fail(machine, "swarm init", exc, f"check that {machine.address} is an address of that "
                        f"machine and that TCP {SWARM_PORT} is free there") from None
    finally:
        c.close()


def join(machine: Machine, manager: Machine) -> str:
    """Join `machine` to the Swarm that `manager` manages, as a worker; returns its node ID."""
    mc = client(manager)
    try:
        try:
            mc.swarm.reload()
            token = mc.swarm.attrs["JoinTokens"]["Worker"]
        except Exception as exc:
            raise _fail(manager, "reading the Swarm's join token", exc,
                        "`labctl cluster init` forms the Swarm on the manager first") from None
    finally:
        mc.close()
    c = client(machine)
    try:
        st = _state(c)
        if st.get("LocalNodeState", "inactive") != "inactive":
            raise LabError(f"machine {machine.name} (engine {machine.engine}) is already in a Swarm "
                           f"(node {st.get('NodeID') or '?'})", RESET_FIX)
        try:
            c.swarm.join(remote_addrs=[f"{manager.address}:{SWARM_PORT}"], join_token=token,
                         listen_addr=f"{machine.address}:{SWARM_PORT}", advertise_addr=machine.address)
        except Exception as exc:
            raise _fail(machine, f"joining the Swarm of {manager.name} at {manager.address}:{SWARM_PORT}", exc,
                        f"check that {machine.name} reaches {manager.address} on TCP {SWARM_PORT} and 7946, "
                        "UDP 7946 and 4789") from None
        return _state(c).get("NodeID", "")
    finally:
        c.close()


def node_id(machine: Machine) -> str:
    """The Swarm node ID of the machine's engine (LabError if it is in no Swarm)."""
    c = client(machine)
    try:
        nid = _state(c).get("NodeID") or ""
    finally:
        c.close()
    if not nid:
        raise LabError(f"machine {machine.name} (engine {machine.engine}) is in no Swarm",
                       "`labctl cluster join` joins it")
    return nid


def _its_node(c, nid: str, manager: Machine, machine: Machine):
    """The manager's Swarm node `nid`, which `machine`'s engine says is its own: believed only if
    the manager sees it at the machine's address and labelled as no other machine (a machine's
    engine, wrong or hostile, could name another machine's node: relabelled, placement would pin
    that machine's nodes elsewhere; removed, a running lab's machine would go)."""
    try:
        node = c.nodes.get(nid)
    except Exception as exc:
        raise _fail(manager, f"reading the Swarm node {nid} of {machine.name}", exc,
                    f"is {manager.name} a manager of the Swarm {machine.name} joined?") from None
    addr = (node.attrs.get("Status") or {}).get("Addr")
    labelled = ((node.attrs.get("Spec") or {}).get("Labels") or {}).get(MACHINE_LABEL)
    if addr != machine.address or labelled not in (None, machine.name):
        raise LabError(f"machine {machine.name}'s engine says its Swarm node is {terminal_safe(nid)[:80]}, but the "
                       f"manager {manager.name} sees that node at {terminal_safe(str(addr))[:80]}"
                       + (f", labelled as machine {terminal_safe(str(labelled))[:80]}" if labelled else "")
                       + f", not at {machine.address}",
                       f"check that {machine.engine} is {machine.name}'s engine; " + RESET_FIX)
    return node


def label(manager: Machine, machine: Machine) -> None:
    """Set the Swarm node label labctl.machine=NAME on `machine`'s node: what placement pins by."""
    nid = node_id(machine)
    c = client(manager)
    try:
        node = _its_node(c, nid, manager, machine)
        try:
            spec = dict(node.attrs["Spec"])
            spec["Labels"] = {**(spec.get("Labels") or {}), MACHINE_LABEL: machine.name}
            node.update(spec)
        except Exception as exc:
            raise _fail(manager, f"labelling the Swarm node {nid} of {machine.name}", exc,
                        f"is {manager.name} a manager of the Swarm {machine.name} joined?") from None
    finally:
        c.close()


def nodes(manager: Machine) -> list[dict]:
    """The Swarm's nodes as the manager sees them."""
    c = client(manager, timeout=20)
    try:
        try:
            found = c.nodes.list()
        except Exception as exc:
            raise _fail(manager, "listing the Swarm's nodes", exc, "is it a Swarm manager? " + RESET_FIX) from None
        out = []
        for n in found:
            a = n.attrs
            spec, status = a.get("Spec", {}), a.get("Status", {})
            out.append({"machine": (spec.get("Labels") or {}).get(MACHINE_LABEL), "node_id": a.get("ID"),
                        "hostname": a.get("Description", {}).get("Hostname"), "state": status.get("State"),
                        "availability": spec.get("Availability"), "role": spec.get("Role"),
                        "addr": status.get("Addr")})
        return out
    finally:
        c.close()


def wait_ready(manager: Machine, count: int, timeout: float = 60, progress=None) -> list[dict]:
    """Wait until the manager sees `count` nodes Ready (a joined worker reports in within seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        found = nodes(manager)
        ready = sum(1 for n in found if n["state"] == "ready")
        if progress:
            progress("swarm nodes ready", ready, count)
        if ready >= count:
            return found
        if time.monotonic() > deadline:
            raise LabError(f"only {ready} of {count} Swarm nodes are Ready after {timeout:.0f} s "
                           f"(manager {manager.name})", "`labctl cluster status` shows which; see the engines' logs")
        time.sleep(0.3)


def remove_node(manager: Machine, nid: str, machine: Machine) -> None:
    """Drop the node of `machine`, which has left, from the manager's list (it otherwise stays
    there, Down); only the node the manager sees at its address with its label."""
    c = client(manager, timeout=20)
    try:
        node = _its_node(c, nid, manager, machine)
        if ((node.attrs.get("Spec") or {}).get("Labels") or {}).get(MACHINE_LABEL) != machine.name:
            raise LabError(f"the Swarm node {terminal_safe(nid)[:80]} is not labelled as machine {machine.name}",
                           RESET_FIX)
        node.remove(force=True)
    except LabError:
        raise
    except Exception as exc:
        raise _fail(manager, f"removing Swarm node {nid}", exc, RESET_FIX) from None
    finally:
        c.close()


def leave(machine: Machine, force: bool = True) -> bool:
    """Make the machine's engine leave its Swarm; False if it was in none."""
    c = client(machine, timeout=30)
    try:
        if _state(c).get("LocalNodeState", "inactive") == "inactive":
            return False
        try:
            c.swarm.leave(force=force)
        except Exception as exc:
            raise _fail(machine, "swarm leave", exc, "a manager leaves only with force (the default)") from None
        return True
    finally:
        c.close()
