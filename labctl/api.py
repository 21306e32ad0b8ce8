"""labctl from Python, in Mininet's spirit: build a lab, use it, and always take it down.

    from labctl import Lab
    with Lab("topologies/leaf-spine.yml") as lab:
        print(lab.node("srv1-gpu0").cmd(["ping", "-c1", "srv2-gpu1"]).stdout)   # node names work
        assert lab.pingall() == 0                                                # unreachable pairs
        doc = lab.run("workloads/allreduce.yml")                                 # results.json
        print(lab.counters(busy=True))

A lab can also be written in code (labctl.Topology): Lab(topology). Everything a command does,
the API does the same way (it calls the same functions), so a lab made here is a lab for the CLI
too: `labctl status NAME` shows it, `labctl down NAME` removes it.
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import yaml

from labctl import lifecycle, state
from labctl.errors import LabError
from labctl.plan.model import LabPlan
from labctl.topology.builder import Topology


class PingResult(int):
    """The number of pairs that could not reach each other (0 is good), with the details."""
    tried: int
    failed: list[tuple[str, str]]

    def __new__(cls, tried: int, failed: list[tuple[str, str]]):
        self = super().__new__(cls, len(failed))
        self.tried, self.failed = tried, failed
        return self

    def __repr__(self) -> str:
        return f"PingResult({len(self.failed)} of {self.tried} pairs unreachable)"


class Node:
    """One node of a running lab: run commands inside it, with other nodes' names as addresses."""

    def __init__(self, lab: "Lab", name: str):
        self.lab, self.name = lab, name
        self.spec = lab.plan.node(name)

    @property
    def namespace(self) -> str:
        return self.spec.namespace

    @property
    def addresses(self) -> list[str]:
        return [i.address for i in self.spec.interfaces if i.address] + ([self.spec.loopback] if self.spec.loopback
                                                                        else [])

    def _argv(self, argv) -> list[str]:
        if isinstance(argv, str):
            raise TypeError("give the command as a list (['ping', '-c1', 'srv2-gpu1']): nothing goes through "
                            "a shell")
        from labctl.lifecycle import targets
        return self.lab.backend.exec_argv(self.spec, targets.with_addresses(self.lab.plan, self.name, list(argv)))

    def cmd(self, argv: list[str], check: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run argv inside the node and wait: a CompletedProcess with text stdout and stderr."""
        return subprocess.run(self._argv(argv), capture_output=True, text=True, check=check, timeout=timeout)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start argv inside the node and return at once (stdout/stderr as you pass them)."""
        return subprocess.Popen(self._argv(argv), **kwargs)

    def __repr__(self) -> str:
        return f"<Node {self.name} ({self.spec.kind}) in {self.lab.name}>"


class Lab:
    def __init__(self, source: str | Path | Topology | None = None, name: str | None = None, vars: dict | None = None,
                 backend: str = "netns", topo: str | None = None, trust: bool = False):
        """`source`: a lab file, or a Topology; `topo`: a Mininet topology, Mininet's own (`linear,3`,
        no source) or one in the Mininet file `source` (`mytopo`, as `mn --custom FILE --topo mytopo`);
        `trust`: run the lab's powerful lines, or read a Mininet file root does not own alone."""
        if source is None and topo is None:
            raise TypeError("give a lab file, a Topology, or topo= (a Mininet topology)")
        self.source, self.backend_name, self.topo, self.trust = source, backend, topo, trust
        self.sets = [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                     for k, v in (vars or {}).items()]
        self._name = name
        self.plan: LabPlan | None = None
        self.record: state.LabDir | None = None

    @property
    def name(self) -> str:
        if self.plan is not None:
            return self.plan.lab
        return self._name or (self.source.name if isinstance(self.source, Topology) else "?")

    @property
    def backend(self):
        return lifecycle.backend_of(self.record)

    def up(self) -> "Lab":
        if self.plan is not None:
            raise LabError(f"lab {self.name!r} is already up")
        if isinstance(self.source, Topology):
            from labctl.topology.load import load_topology_text
            loaded = load_topology_text(self.source.yaml(), f"<Topology {self.source.name}>", self._name)
            self.plan, self.record, _ = lifecycle.build(loaded, self.backend_name)
        else:
            self.plan, self.record, _ = lifecycle.up(None if self.source is None else str(self.source), self.sets,
                                                     self._name, backend=self.backend_name, topo=self.topo,
                                                     trust=self.trust)
        return self

    def down(self) -> None:
        if self.plan is not None and self.record is not None and self.record.path.exists():
            lifecycle.down(self.plan.lab)
        self.plan = self.record = None

    def __enter__(self) -> "Lab":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def _running(self) -> LabPlan:
        if self.plan is None:
            raise LabError(f"lab {self.name!r} is not up", "call lab.up() first, or use `with Lab(...) as lab:`")
        return self.plan

    @property
    def nodes(self) -> list[str]:
        return [n.name for n in self._running().nodes]

    def node(self, name: str) -> Node:
        self._running()
        from labctl.lifecycle import targets
        targets.node(self.plan, name)
        return Node(self, name)

    def pingall(self, fabric: str | None = None, sample: int | None = None) -> PingResult:
        tried, failed = lifecycle.pingall(self._running(), fabric, sample=sample, backend=self.backend)
        return PingResult(tried, failed)

    def route(self, src: str, dst: str, sport: int = 49152, dport: int = 4791) -> list[dict]:
        return lifecycle.trace_path(self._running(), src, dst, sport, dport)

    def run(self, workload: str | Path | dict, out: str | Path | None = None) -> dict:
        """Play a workload (a file, or the same keys as a dict); returns what results.json holds."""
        from labctl.traffic.run import default_run_dir, new_run_dir, run_workload
        from labctl.traffic.workload import load_workload
        plan = self._running()
        with tempfile.TemporaryDirectory(prefix="labctl-workload-") as tmp:
            if isinstance(workload, dict):
                path = Path(tmp) / f"{workload.get('name', 'workload')}.yml"
                path.write_text(yaml.safe_dump(workload, sort_keys=False))
            else:
                path = Path(workload)
            loaded = load_workload(path)
            target = new_run_dir(Path(out) if out else default_run_dir(loaded.workload.name))
            return run_workload(plan, self.record, loaded, target, trace=lifecycle.trace_path)

    def counters(self, busy: bool = False) -> list[dict]:
        """Every port and class: depth, packets, bytes, drops, ECN marks, PFC frames (as `labctl counters`)."""
        from labctl.dataplane import control
        from labctl.telemetry.queues import lab_queues
        rows = lab_queues(self._running(), self.record.path, control.settings_in_force(self.plan, self.record.path))
        return [r for r in rows if r["sent_packets"] or r["drops"] or r.get("pfc_tx")] if busy else rows

    def losses(self) -> dict:
        """The loss ledger since the lab came up (as `labctl counters --losses`)."""
        from labctl.telemetry import ledger
        return ledger.since_up(self._running(), self.record)

    def link(self, port: str, up: bool) -> int:
        """Cut (up=False) or restore a link at NODE:PORT; returns how many routes changed."""
        from labctl.lifecycle import targets
        node, iface = targets.port(self._running(), port)
        return lifecycle.set_link_state(self.record, self.plan, node, iface.name, up)

    def tc(self, target: str, rate: str | None = None, **settings) -> None:
        """As `labctl tc set TARGET`: rate=..., ecn/pfc="on"/"off", kmin/kmax/xoff/xon sizes, pmax."""
        from labctl.lifecycle import targets
        node, iface = targets.port(self._running(), target, need_port=False)
        lifecycle.tc_set(self.record, self.plan, node, iface.name if iface else None,
                         settings.pop("class_name", None), rate, **settings)

    def __repr__(self) -> str:
        return f"<Lab {self.name} ({'up' if self.plan else 'down'})>"
