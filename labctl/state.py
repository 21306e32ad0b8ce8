"""The lab directory: what a lab is and what was made for it, so that down and clean never guess.

    <state dir>/<lab>/plan.json   the compiled plan
    <state dir>/<lab>/state.json  status (building | up), the pid that built it, the topology file
    <state dir>/<lab>/journal     one line per thing created, written *before* creating it

The journal is append-only and flushed line by line, so a build killed with SIGKILL still leaves a
record of everything it may have made; `labctl clean` removes exactly that and nothing else.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import LabError


def state_root() -> Path:
    env = os.environ.get("LABCTL_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "labctl"


@dataclass
class LabDir:
    name: str
    path: Path

    @property
    def plan_file(self) -> Path:
        return self.path / "plan.json"

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def journal_file(self) -> Path:
        return self.path / "journal"

    def read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {"status": "unknown"}

    def write_state(self, **fields) -> None:
        state = self.read_state() if self.state_file.exists() else {}
        state.update(fields)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)

    def read_plan(self) -> dict:
        return json.loads(self.plan_file.read_text())

    def journal(self, kind: str, value: str) -> None:
        with open(self.journal_file, "a") as f:
            f.write(f"{kind} {value}\n")

    def journaled(self, kind: str) -> list[str]:
        """Everything of `kind` ever journaled, minus what was later journaled as released."""
        try:
            lines = self.journal_file.read_text().splitlines()
        except OSError:
            return []
        items: list[str] = []
        for line in lines:
            k, _, v = line.partition(" ")
            if k == kind and v not in items:
                items.append(v)
            elif k == f"released-{kind}" and v in items:
                items.remove(v)
        return items

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def lab_dir(name: str) -> LabDir:
    return LabDir(name, state_root() / name)


def claim(name: str, plan: dict, topology_file: str | None) -> LabDir:
    """Create the lab directory atomically; refuse if a lab of that name exists or half-exists."""
    d = lab_dir(name)
    d.path.parent.mkdir(parents=True, exist_ok=True)
    try:
        d.path.mkdir()
    except FileExistsError:
        state = d.read_state()
        pid = state.get("pid")
        from labctl.backends.nsutil import pid_alive
        if state.get("status") == "building" and pid and pid_alive(pid):
            raise LabError(f"lab {name!r} is being built right now by process {pid}",
                           "wait for it, or choose another name with --name") from None
        if state.get("status") == "up":
            raise LabError(f"lab {name!r} is already up",
                           f"`labctl down {name}` first, or start a second copy with --name {name}2") from None
        raise LabError(f"lab {name!r} has remains of an interrupted run in {d.path}",
                       "`labctl clean` removes them") from None
    (d.path / "plan.json").write_text(json.dumps(plan))  # compact: the C encoder, 10x faster
    d.write_state(lab=name, status="building", pid=os.getpid(), started=time.time(),
                  topology_file=topology_file)
    return d


def all_labs() -> list[LabDir]:
    root = state_root()
    if not root.is_dir():
        return []
    return [LabDir(p.name, p) for p in sorted(root.iterdir()) if p.is_dir()]
