"""The switch agents' counters, read as one report whichever way the agents are placed.

An agent serving the whole lab writes `pfc.json` in the lab's directory; an agent per node writes
`agents/NODE/pfc.json` (dataplane/agents.py). Every reader (status, samplers, runs, the ledger, `tc set`)
takes the lab's counters from `load` or a `Watch` here, never from a file, so none of them knows
where the agents run. Merged, the report is what one agent would have written:
- `ports`: every agent's, together;
- `reaction_hist`, `work_hist`: the sums (each agent measures its own reads);
- `long_reads`, `slow_steps`, `errors`: all of them, in time order where they have one;
- `generation`: the oldest applied, so a change counts as live only once every agent has it;
- `agents`: how many reports were merged.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from labctl.state import AGENTS as DIRECTORY  # noqa: F401  (callers name the agents' directory by this module)
from labctl.state import agent_directory, agent_nodes  # noqa: F401 (agent_nodes: for readers)

FILE = "pfc.json"
SUMMED = ("reaction_hist", "work_hist")


directory = agent_directory      # where each node's agent keeps its files (state.py)


def files(lab_path: Path) -> list[Path]:
    """The report files of the lab's agents that exist now."""
    lab_path = Path(lab_path)
    out = [lab_path / FILE] if (lab_path / FILE).exists() else []
    for node in agent_nodes(lab_path):
        f = directory(lab_path, node) / FILE
        if f.exists():
            out.append(f)
    return out


MAX_REPORT = 64 << 20     # a 1,024-GPU lab's report is a few MB


def read_agent_file(f: Path, limit: int = MAX_REPORT) -> bytes | None:
    """A file of an agent's directory. That directory is bound into the node's container, so what
    is there is the container's to make: a link is not followed (to /dev/zero, say), and only a
    regular file of at most `limit` bytes is read."""
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_report(f: Path) -> dict | None:
    """One agent's report (read_agent_file), or None."""
    data = read_agent_file(f)
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def merge(docs: list[dict]) -> dict:
    """One report from several agents' (see the module's docstring)."""
    if len(docs) == 1:
        return {**docs[0], "agents": 1}
    out: dict = {"time": max((d.get("time", 0) for d in docs), default=0),
                 "generation": min((d.get("generation", 0) for d in docs), default=0),
                 "ports": [p for d in docs for p in d.get("ports") or []],
                 "long_reads": sorted(r for d in docs for r in d.get("long_reads") or []),
                 "slow_steps": [s for d in docs for s in d.get("slow_steps") or []],
                 "errors": [e for d in docs for e in d.get("errors") or []],
                 "agents": len(docs)}
    for key in SUMMED:
        lists = [d[key] for d in docs if isinstance(d.get(key), list)]
        if lists and all(len(x) == len(lists[0]) for x in lists):
            out[key] = [sum(column) for column in zip(*lists)]
    return out


def load(lab_path: Path) -> dict | None:
    """The lab's merged report, or None if no agent has written one."""
    docs = [d for d in (read_report(f) for f in files(lab_path)) if d is not None]
    return merge(docs) if docs else None


class Watch:
    """The merged report, re-read only when one of the agents' files changed (a 100 Hz sampler
    looks every 10 ms; the agents rewrite theirs at most that often)."""
    def __init__(self, lab_path: Path | None):
        self.lab_path = Path(lab_path) if lab_path is not None else None
        self.mtimes: dict[Path, float] = {}
        self.docs: dict[Path, dict] = {}
        self.paths: list[Path] = []

    def get(self) -> dict | None:
        """The newest merged report if any file changed since the last call, else None."""
        if self.lab_path is None:
            return None
        if not self.paths:
            self.paths = files(self.lab_path)
        changed = False
        for f in self.paths:
            try:
                mtime = os.stat(f).st_mtime
            except OSError:
                continue
            if mtime != self.mtimes.get(f):
                doc = read_report(f)
                if doc is not None:
                    self.docs[f], self.mtimes[f] = doc, mtime
                    changed = True
        return merge(list(self.docs.values())) if changed else None
