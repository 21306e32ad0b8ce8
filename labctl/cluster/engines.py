"""The Docker engines that run one lab's container nodes: this host's, and each machine's."""
from __future__ import annotations

from labctl.errors import LabError
from labctl.plan.model import Node


class Engines:
    """The engines that run a lab's container nodes, a client each, opened on first use: this host's,
    and for a placed node (plan/placement.py) its machine's, where Swarm named its task's container."""

    def __init__(self):
        self._clients: dict[str | None, object] = {}

    def client(self, machine: str | None):
        if machine not in self._clients:
            if machine is None:
                from labctl.containers import engine
                self._clients[None] = engine.client()
            else:
                from labctl.cluster import machines
                known = machines.load()
                if machine not in known:
                    raise LabError(f"machine {machine!r} is not in labctl's cluster record",
                                   "`labctl cluster status` lists the machines")
                self._clients[machine] = machines.client(known[machine])
        return self._clients[machine]

    def container(self, node: Node):
        """The node's running container (None if there is none)."""
        client = self.client(node.machine)
        if node.machine is None:
            from labctl.containers.nodes import _container
            return _container(client, node.container.name)
        found = client.containers.list(filters={"label": f"com.docker.swarm.service.name={node.container.name}",
                                                "status": "running"})
        if len(found) > 1:
            raise LabError(f"node {node.name}: {len(found)} containers of its service run on machine {node.machine}",
                           "take its lab down (`labctl status` names it) and up again")
        if found:
            from labctl.cluster.services import verified_pid
            # never enter a process labctl cannot vouch for; and what the list said of it is not
            # what was checked: every later use of its PID (exec_pid) gets the checked one
            found[0].attrs["State"]["Pid"] = verified_pid(client, found[0].id, node)
        return found[0] if found else None

    def engine_url(self, machine: str | None) -> str:
        if machine is None:
            from labctl.containers import engine
            return f"unix://{engine.SOCKET}"
        from labctl.cluster import machines
        return machines.load()[machine].engine

    def argv(self, node: Node, argv: list[str], interactive: bool = False) -> list[str]:
        from labctl.containers.nodes import enter_argv
        return enter_argv(self.container(node), self.engine_url(node.machine), argv, interactive)

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()
