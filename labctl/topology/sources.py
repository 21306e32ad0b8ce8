"""Where a lab comes from: a labctl YAML file (the usual case), or a Mininet topology.

A Mininet topology is Python: a custom file's `topos = {'name': MyTopo}` (as `mn --custom`), or one
of Mininet's own (single,N  linear,K[,N]  tree,DEPTH[,FANOUT]). Reading a custom file runs its
code, as root, so it happens only when the user asks for it with `--topo NAME`, never for a .yml,
and in a process of its own under the system Python (where Debian's mininet imports). Mininet
hosts become labctl hosts, Mininet switches become `bridge` nodes (L2 switches), and a link's
bw (Mbit/s), delay and loss (%) become its rate, latency and loss fraction: the WAN line carries
the delay, since this kernel may have no netem.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from labctl.errors import InputError, Where
from labctl.paths import is_file
from labctl.topology.load import Loaded, load_topology, load_topology_text, render_topology

SYSTEM_PYTHON = "/usr/bin/python3"
READER = Path(__file__).with_name("mininet_topo.py")
MININET_DEFAULT_RATE = "1G"      # an unshaped Mininet link; labctl shapes every link, so this is its rate


def load(file: str | None, sets=(), template_dirs=(), name: str | None = None, topo: str | None = None,
         maps=None) -> Loaded:
    if topo is not None:
        return load_topology_text(mininet_yaml(file, topo, name), origin(file, topo))
    if file is None:
        raise InputError(Where("labctl"), "no lab file given", "give a lab file, or --topo NAME for a Mininet topology")
    if str(file).endswith(".py"):
        raise InputError(Where(str(file)), "this is a Python file: labctl runs a Mininet topology file only "
                         "when asked to, since that executes it",
                         "name the topology in it: --topo NAME (its `topos` dictionary says which)")
    return load_topology(file, sets, template_dirs, name, maps)


def render(file: str | None, sets=(), template_dirs=(), topo: str | None = None, maps=None) -> str:
    if topo is not None:
        return mininet_yaml(file, topo, None)
    return render_topology(file, sets, template_dirs, maps)[0]


def origin(file: str | None, topo: str) -> str:
    return f"{file} (Mininet topology {topo})" if file else f"Mininet topology {topo}"


def mininet_yaml(file: str | None, topo: str, name: str | None) -> str:
    """The Mininet topology as a labctl lab file (what `labctl render FILE --topo NAME` prints)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(,([A-Za-z_][A-Za-z0-9_]*=)?[A-Za-z0-9_.+-]+){0,8}", topo):
        raise InputError(Where("--topo"), f"{topo!r} is not NAME[,ARG...][,KEY=VALUE...] (as `mn --topo`)",
                         "e.g. --topo linear,3  --topo tree,depth=2,fanout=2  --topo mytopo")
    if file is not None and not is_file(file):
        raise InputError(Where(str(file)), "no such Mininet topology file", "give the path to the .py file")
    if not is_file(SYSTEM_PYTHON):
        raise InputError(Where("--topo"), f"{SYSTEM_PYTHON} is missing", "install Mininet (./install.sh does)")
    r = subprocess.run([SYSTEM_PYTHON, "-P", str(READER), str(Path(file).resolve()) if file else "-", topo],
                       capture_output=True, text=True, timeout=120, cwd="/")
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["it failed"])[-1]
        raise InputError(Where(str(file) if file else "--topo"), f"cannot read Mininet topology {topo!r}: {why}",
                         "check the name (--topo NAME or NAME,ARG,...), and that Mininet is installed (./install.sh)")
    mn = json.loads(r.stdout)
    lab = name or _lab_name(file, topo)
    nodes = {h: {"kind": "host"} for h in mn["hosts"]}
    nodes.update({s: {"kind": "bridge"} for s in mn["switches"]})
    links = []
    for lk in mn["links"]:
        link = {"endpoints": [lk["a"], lk["b"]]}
        if lk.get("bw"):
            link["rate"] = f"{lk['bw']}M"
        if lk.get("delay"):
            link["latency"] = str(lk["delay"])
        if lk.get("jitter"):
            link["jitter"] = str(lk["jitter"])
        if lk.get("loss"):
            link["loss"] = float(lk["loss"]) / 100
        links.append(link)
    doc = {"name": lab, "description": f"imported from {origin(file, topo)}", "dilation": 1,
           "defaults": {"rate": MININET_DEFAULT_RATE}, "nodes": nodes, "links": links}
    return f"# {origin(file, topo)}, as labctl reads it\n" + yaml.safe_dump(doc, sort_keys=False)


def _lab_name(file: str | None, topo: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", ((Path(file).stem + "-") if file else "mn-") + topo.lower()).strip("-")
    stem = stem if stem[:1].isalpha() else "mn-" + stem
    return stem[:24].rstrip("-")
