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
        """Its kernel is this host's, so labctl reaches its nodes' namespaces: a machine emulated here
        (cluster/emulate.py), or this host's own engine at Docker's socket. Any other engine, even
        one behind a unix socket (forwarded, rootless, in a VM), is taken for another kernel's."""
        from labctl.containers.engine import SOCKET
        return self.engine == (emulated_engine(self.name) if self.netns else f"unix://{SOCKET}")

    def check(self) -> "Machine":
        if not NAME_PATTERN.match(self.name):
            raise LabError(f"{self.name!r} is not a machine name",
                           "lower-case letters, digits and '-', starting with a letter, at most 16 characters")
        if not self.engine.startswith(ENGINE_SCHEMES):
            raise LabError(f"machine {self.name}: engine {self.engine!r} is not a Docker engine URL",
                           "give unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST")
        if self.netns is not None and (self.netns != emulated_netns(self.name)
                                       or self.engine != emulated_engine(self.name)):
            raise LabError(f"machine {self.name}: namespace {self.netns!r} and engine {self.engine} are not those "
                           "of a machine labctl emulates", "`labctl cluster reset` forgets the record")
        try:
            ipaddress.IPv4Address(self.address)
        except ValueError:
            raise LabError(f"machine {self.name}: {self.address!r} is not an IPv4 address",
                           "give the machine's address on the network that joins the machines") from None
        return self


def emulated_netns(name: str) -> str:
    """The namespace of a machine cluster/emulate.py makes."""
    return f"lcm-{name}"


def emulated_engine(name: str) -> str:
    return f"unix:///run/lcm-{name}.sock"


FIELDS = {"name": str, "engine": str, "address": str, "netns": (str, type(None)), "manager": bool}


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
    bad = LabError(f"{record_path()} is not a record labctl wrote", "`labctl cluster reset` forgets it")
    if not isinstance(raw, dict) or not isinstance(raw.get("machines", []), list):
        raise bad
    out = {}
    for m in raw.get("machines", []):
        if not isinstance(m, dict) or set(m) - set(FIELDS) or not {"name", "engine", "address"} <= set(m) \
                or not all(isinstance(v, FIELDS[k]) for k, v in m.items()):
            raise bad
        machine = Machine(**m).check()
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
