"""Runtime settings of the data-plane controller: a small JSON file in the lab directory.

`labctl tc set` merges a change into control.json and bumps its generation; the controller
notices the new mtime within one idle period (10 ms), applies it, and reports the generation it
applied in pfc.json, so the command can wait until the change is live. The plan stays what `up`
built; control.json is what changed since, and `tc show` displays the two merged.

Keys are "NODE:PORT:TC"; each maps to any of ecn (bool), pfc (bool), kmin, kmax, xoff, xon
(bytes) and pmax (probability). Absent keys keep the plan's value.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

FILE = "control.json"
SETTINGS = {"ecn": bool, "pfc": bool, "kmin": int, "kmax": int, "pmax": float, "xoff": int, "xon": int}


def key(node: str, port: str, tc: int) -> str:
    return f"{node}:{port}:{tc}"


def load(lab_path: Path) -> dict:
    try:
        doc = json.loads((Path(lab_path) / FILE).read_text())
    except (OSError, ValueError):
        return {"generation": 0, "ports": {}}
    return {"generation": int(doc.get("generation", 0)), "ports": dict(doc.get("ports", {}))}


def merge(lab_path: Path, changes: dict[str, dict]) -> int:
    """Add `changes` (key -> settings) to the lab's control file; returns the new generation."""
    for k, settings in changes.items():
        unknown = set(settings) - set(SETTINGS)
        if unknown:
            raise ValueError(f"{k}: unknown settings {sorted(unknown)}")
    doc = load(lab_path)
    for k, settings in changes.items():
        doc["ports"].setdefault(k, {}).update(settings)
    doc["generation"] += 1
    path = Path(lab_path) / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return doc["generation"]


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

    def validate(self, where: str) -> None:
        if not 0 <= self.pmax <= 1:
            raise ValueError(f"{where}: pmax {self.pmax} is not a probability (0..1)")
        if self.kmin > self.kmax:
            raise ValueError(f"{where}: kmin {self.kmin} is above kmax {self.kmax}")
        if self.xon > self.xoff:
            raise ValueError(f"{where}: xon {self.xon} is above xoff {self.xoff}")


def settings_for(plan, node, iface, cls, overrides: dict) -> PortSettings:
    e = plan.ecn
    s = PortSettings(ecn=cls.ecn and node.forwarding, pfc=cls.lossless, kmin=e.kmin, kmax=e.kmax, pmax=e.pmax,
                     xoff=cls.xoff_bytes, xon=cls.xon_bytes)
    for name, value in overrides.get(key(node.name, iface.name, cls.tc), {}).items():
        setattr(s, name, SETTINGS[name](value))
    return s


def wait_applied(lab_path: Path, generation: int, timeout: float = 2.0) -> bool:
    """True once the controller reports having applied `generation` (pfc.json)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads((Path(lab_path) / "pfc.json").read_text()).get("generation", 0) >= generation:
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    return False


ECN_KEYS, PFC_KEYS = {"ecn", "kmin", "kmax", "pmax"}, {"pfc", "xoff", "xon"}


def apply(lab_path: Path, plan, node, iface: str | None, class_name: str | None, changes: dict) -> int:
    """Send `changes` for the classes of node[:iface] they apply to; returns how many port classes
    changed once the controller confirmed them. ECN settings go to ECN classes on switches, PFC
    settings to lossless classes."""
    from labctl.errors import LabError
    overrides = load(lab_path)["ports"]
    picked = {}
    for i in node.interfaces:
        if iface and i.name != iface:
            continue
        for c in i.shaping.classes:
            if class_name and c.name != class_name:
                continue
            wanted = {k: v for k, v in changes.items()
                      if (k in ECN_KEYS and c.ecn and node.forwarding) or (k in PFC_KEYS and c.lossless)}
            if not wanted:
                continue
            st = settings_for(plan, node, i, c, overrides)
            for k, v in wanted.items():
                setattr(st, k, v)
            try:
                st.validate(f"{node.name}:{i.name} class {c.name}")
            except ValueError as exc:
                raise LabError(str(exc), "give both thresholds so that low <= high") from None
            picked[key(node.name, i.name, c.tc)] = wanted
    if not picked:
        classes = sorted({c.name for i in node.interfaces for c in i.shaping.classes})
        raise LabError(f"no class on {node.name}{':' + iface if iface else ''} takes {sorted(changes)}",
                       "ECN settings apply to ECN classes on switches, PFC settings to lossless classes; "
                       f"classes here: {', '.join(classes)}")
    generation = merge(lab_path, picked)
    if not wait_applied(lab_path, generation):
        raise LabError("the lab's controller did not confirm the change within 2 s",
                       "is the lab up? `labctl status` shows the controller; `labctl down` and `up` restart it")
    return len(picked)
