"""The machines a lab may be placed on: each is a Docker engine in one Swarm, with the underlay
address its cross-machine links (VXLAN) leave from.

The record (`cluster.json` in labctl's state directory) names each machine, its engine's URL and
its underlay address, and, for a machine emulated on this host (cluster/emulate.py), the network
namespace it lives in. Placement in a lab file (`placement:`) names these machines; Swarm places
each node's container by the node label `labctl.machine` that `labctl cluster init/join` sets.
"""
from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from labctl.errors import LabError

MACHINE_LABEL = "labctl.machine"         # a Swarm node label: the machine a node's task runs on
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
ENGINE_SCHEMES = ("unix://", "tcp://", "ssh://")


@dataclass(frozen=True)
class Machine:
    name: str                 # what `placement:` names, and the Swarm node label labctl.machine
    engine: str               # its Docker engine: unix:///run/x.sock, tcp://host:2376, ssh://root@host
    address: str              # its underlay IPv4 address: VXLAN links leave and arrive there
    netns: str | None = None  # emulated on this host: the network namespace it lives in
    manager: bool = False     # a Swarm manager (labctl places services through it)

    @property
    def on_this_host(self) -> bool:
        """Its kernel is this host's (an emulated machine, or this host's own engine): labctl reaches
        its nodes' namespaces. An engine reached over TCP or SSH runs on another kernel."""
        return self.engine.startswith("unix://")

    def check(self) -> "Machine":
        if not NAME_PATTERN.match(self.name):
            raise LabError(f"{self.name!r} is not a machine name",
                           "lower-case letters, digits and '-', starting with a letter, at most 16 characters")
        if not self.engine.startswith(ENGINE_SCHEMES):
            raise LabError(f"machine {self.name}: engine {self.engine!r} is not a Docker engine URL",
                           "give unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST")
        try:
            ipaddress.IPv4Address(self.address)
        except ValueError:
            raise LabError(f"machine {self.name}: {self.address!r} is not an IPv4 address",
                           "give the machine's address on the network that joins the machines") from None
        return self


def record_path() -> Path:
    from labctl.state import state_root
    return state_root() / "cluster.json"


def load() -> dict[str, Machine]:
    """The machines labctl knows, by name ({} before `labctl cluster init`)."""
    try:
        raw = json.loads(record_path().read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LabError(f"{record_path()} cannot be read ({exc})", "`labctl cluster reset` forgets it") from None
    out = {}
    for m in raw.get("machines", []):
        machine = Machine(**{k: m[k] for k in ("name", "engine", "address", "netns", "manager") if k in m}).check()
        out[machine.name] = machine
    return out


def save(machines: dict[str, Machine]) -> None:
    from labctl.state import checked_root, write_private
    checked_root(create=True)
    write_private(record_path(), json.dumps({"machines": [asdict(m) for m in machines.values()]}, indent=1))


def manager(machines: dict[str, Machine] | None = None) -> Machine:
    machines = load() if machines is None else machines
    for m in machines.values():
        if m.manager:
            return m
    raise LabError("labctl knows no Swarm manager", "`labctl cluster init` forms a Swarm (or `labctl cluster "
                   "emulate 3` emulates three machines on this host)")


def client(machine: Machine, timeout: int = 120):
    """A Docker client of the machine's engine; LabError if it does not answer."""
    from labctl.containers import engine
    docker = engine.sdk()
    try:
        c = docker.DockerClient(base_url=machine.engine, timeout=timeout,
                                use_ssh_client=machine.engine.startswith("ssh://"))
        c.ping()
        return c
    except Exception as exc:    # the SDK raises requests' and its own errors alike
        raise LabError(f"machine {machine.name}: no Docker engine answers at {machine.engine} ({type(exc).__name__})",
                       "`labctl cluster status` shows the machines; start the engine there") from None
