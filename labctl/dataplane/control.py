"""Runtime settings of the data-plane controller: a small JSON file in the lab directory.

`labctl tc set` merges a change into control.json and bumps its generation; the controller
notices the new mtime within one idle period (10 ms), applies it, and reports the generation it
applied in pfc.json, so the command can wait until the change is live. The plan stays what `up`
built; control.json is what changed since, and `tc show` displays the two merged.

Keys are "NODE:PORT:TC"; each maps to any of ecn (bool), pfc (bool), kmin, kmax, xoff, xon
(bytes) and pmax (probability). Absent keys keep the plan's value.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from labctl.telemetry import agentreport

FILE = "control.json"
# `rate` is a port's rate in bit/s, not a user's setting: `tc set --rate` sends it to each lossless
# class of the port, whose pause quanta last 512 bit times at it and whose gate opens above it
SETTINGS = {"ecn": bool, "pfc": bool, "kmin": int, "kmax": int, "pmax": float, "xoff": int, "xon": int, "rate": int}


def key(node: str, port: str, tc: int) -> str:
    return f"{node}:{port}:{tc}"


def load(lab_path: Path, strict: bool = False) -> dict:
    """The control file, checked; a missing file is the plan's settings. A malformed one raises
    ValueError when `strict` (the controller keeps what it applied and says why), else counts as
    absent."""
    try:
        text = (Path(lab_path) / FILE).read_text()
    except OSError:
        return {"generation": 0, "ports": {}}
    try:
        return parse(json.loads(text))
    except ValueError:
        if strict:
            raise
        return {"generation": 0, "ports": {}}


def parse(doc) -> dict:
    """Check a control document's shape and every value's type and range."""
    if not isinstance(doc, dict):
        raise ValueError(f"{FILE}: not a JSON object")
    generation = doc.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise ValueError(f"{FILE}: generation {generation!r} is not a non-negative integer")
    ports = doc.get("ports", {})
    if not isinstance(ports, dict):
        raise ValueError(f"{FILE}: ports is not an object")
    for k, settings in ports.items():
        if not isinstance(settings, dict):
            raise ValueError(f"{FILE}: {k}: not an object")
        for name, value in settings.items():
            check_value(f"{FILE}: {k}", name, value)
    return {"generation": generation, "ports": ports}


def check_value(where: str, name: str, value) -> None:
    kind = SETTINGS.get(name)
    if kind is None:
        raise ValueError(f"{where}: unknown setting {name!r} (known: {', '.join(SETTINGS)})")
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 1 << 40
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 <= value <= 1
    if not ok:
        unit = " from 0 to 1" if kind is float else (" bit/s" if name == "rate" else " of bytes") if kind is int else ""
        raise ValueError(f"{where}: {name} = {value!r} is not a valid {kind.__name__}{unit}")


@contextlib.contextmanager
def _locked(lab_path: Path):
    """One writer at a time: two `tc set` at once must not lose either change."""
    with open(Path(lab_path) / (FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def merge(lab_path: Path, changes: dict[str, dict]) -> int:
    """Add `changes` (key -> settings) to the lab's control file; returns the new generation."""
    for k, settings in changes.items():
        for name, value in settings.items():
            check_value(k, name, value)
    with _locked(lab_path):
        doc = load(lab_path)
        for k, settings in changes.items():
            doc["ports"].setdefault(k, {}).update(settings)
        doc["generation"] += 1
        _write(Path(lab_path), doc)
        # an agent inside a node sees only its own directory: its ports' part of every generation
        for node in agentreport.agent_nodes(lab_path):
            own = {k: v for k, v in doc["ports"].items() if k.split(":", 1)[0] == node}
            _write(agentreport.directory(lab_path, node), {"generation": doc["generation"], "ports": own})
    return doc["generation"]


def _write(directory: Path, doc: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".control-", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, directory / FILE)


@dataclass
class PortSettings:
    """What the controller applies to one port's class: the plan's values unless overridden."""
    ecn: bool
    pfc: bool
    kmin: int
    kmax: int
    pmax: float
    xoff: int
    xon: int
    rate: int       # the port's rate (bit/s): the plan's until `tc set --rate` changes it

    def problem(self, where: str) -> tuple[str, str] | None:
        """(what is wrong, the fix) with these settings, or None."""
        if not 0 <= self.pmax <= 1:
            return f"{where}: pmax {self.pmax} is not a probability", "give --pmax from 0 to 1 (e.g. 0.2)"
        if self.kmin > self.kmax:
            return (f"{where}: kmin {self.kmin} is above kmax {self.kmax}",
                    "give --kmin at most --kmax (both, if the one in force is in the way)")
        if self.xon > self.xoff:
            return (f"{where}: xon {self.xon} is above xoff {self.xoff}",
                    "give --xon at most --xoff (both, if the one in force is in the way)")
        return None

    def validate(self, where: str) -> None:
        wrong = self.problem(where)
        if wrong:
            raise ValueError(wrong[0])


def settings_for(plan, node, iface, cls, overrides: dict) -> PortSettings:
    e = plan.ecn
    s = PortSettings(ecn=cls.ecn and node.switching, pfc=cls.lossless, kmin=cls.kmin_bytes or e.kmin,
                     kmax=cls.kmax_bytes or e.kmax, pmax=e.pmax,
                     xoff=cls.xoff_bytes, xon=cls.xon_bytes, rate=iface.shaping.rate_bps)
    for name, value in overrides.get(key(node.name, iface.name, cls.tc), {}).items():
        setattr(s, name, SETTINGS[name](value))
    return s


def settings_in_force(plan, lab_path: Path):
    """settings(node, iface, cls) as the controller applies them now: the plan's, with control.json's changes."""
    overrides = load(lab_path)["ports"]
    return lambda node, iface, cls: settings_for(plan, node, iface, cls, overrides)


def wait_applied(lab_path: Path, generation: int, timeout: float = 2.0) -> bool:
    """True once every switch agent reports having applied `generation` (agentreport.py)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (agentreport.load(lab_path) or {}).get("generation", 0) >= generation:
            return True
        time.sleep(0.01)
    return False


ECN_KEYS, PFC_KEYS = {"ecn", "kmin", "kmax", "pmax"}, {"pfc", "xoff", "xon"}


def send(lab_path: Path, picked: dict[str, dict]) -> None:
    """Picked port classes' changes (`pick`), several targets' together, as one generation: the
    controller takes all of them or, if it does not answer, none yet."""
    from labctl.errors import LabError
    generation = merge(lab_path, picked)
    if not wait_applied(lab_path, generation):
        raise LabError("the lab's controller did not confirm the change within 2 s",
                       "is the lab up? `labctl status` shows the controller; `labctl down` and `up` restart it")


# What a queue of `buffer` bytes can reach: marking starts below it (a Kmin at the buffer never
# marks), reaches Pmax within it (tc-red(8) asks the same: a limit above max), and a pause starts
# before it is full (an XOFF at the buffer drops before it pauses). XON stays below XOFF (validate).
# a Kmax above the buffer is not refused: marking then never reaches Pmax, which the plan allows
# (a profile scaled to a fast port, qos.ecn.rate) and `tc show` marks, so tc set can put it back
REACH = {"kmin": ("below", "it would never mark"),
         "xoff": ("below", "it would drop before it pauses")}


def check_buffer(port: str, cls, wanted: dict) -> None:
    """Refuse a threshold of `wanted` that class `cls`'s queue on `port` can never reach."""
    from labctl.errors import LabError
    from labctl.plan.buffers import format_buffer
    buffer = cls.buffer_bytes
    for name, (limit, why) in REACH.items():
        value = wanted.get(name)
        if value is None or value < buffer:
            continue
        raise LabError(f"{port} class {cls.name}: --{name} {format_buffer(value)} is at or above the queue's buffer of "
                       f"{format_buffer(buffer)} ({buffer} B): {why}",
                       f"give --{name} {limit} {format_buffer(buffer)} (`labctl tc show {port}` shows each "
                       "class's buffer)")


def pick(lab_path: Path, plan, node, iface: str | None, class_name: str | None, changes: dict) -> dict:
    """The port classes of node[:iface] that `changes` apply to, each with its changes, checked
    against what is in force; nothing is changed. ECN settings go to ECN classes on switches, PFC
    settings to lossless classes."""
    from labctl.errors import LabError
    overrides = load(lab_path)["ports"]
    if class_name is not None:
        known = sorted({c.name for i in node.interfaces if not iface or i.name == iface for c in i.shaping.classes})
        if class_name not in known:
            import difflib
            close = difflib.get_close_matches(class_name, known, n=1)
            raise LabError(f"{node.name}{':' + iface if iface else ''} has no class {class_name!r}"
                           + (f" (did you mean {close[0]!r}?)" if close else ""),
                           f"classes here: {', '.join(known)}")
    picked = {}
    for i in node.interfaces:
        if iface and i.name != iface:
            continue
        for c in i.shaping.classes:
            if class_name and c.name != class_name:
                continue
            wanted = {k: v for k, v in changes.items()
                      if (k in ECN_KEYS and c.ecn and node.switching) or (k in PFC_KEYS and c.lossless)}
            if not wanted:
                continue
            st = settings_for(plan, node, i, c, overrides)
            for k, v in wanted.items():
                setattr(st, k, v)
            wrong = st.problem(f"{node.name}:{i.name} class {c.name}")
            if wrong:
                raise LabError(*wrong)
            check_buffer(f"{node.name}:{i.name}", c, wanted)
            picked[key(node.name, i.name, c.tc)] = wanted
    if not picked:
        classes = sorted({c.name for i in node.interfaces for c in i.shaping.classes})
        raise LabError(f"no class on {node.name}{':' + iface if iface else ''} takes {sorted(changes)}",
                       "ECN settings apply to ECN classes on switches, PFC settings to lossless classes; "
                       f"classes here: {', '.join(classes)}")
    return picked
