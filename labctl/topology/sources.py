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

import re
from pathlib import Path

import yaml

from labctl.errors import InputError, Where
from labctl.names import printable
from labctl.paths import is_file
from labctl.topology import mininet_read
from labctl.topology.load import Loaded, load_topology, load_topology_text, render_topology

MININET_DEFAULT_RATE = "1G"      # an unshaped Mininet link; labctl shapes every link, so this is its rate


def load(file: str | None, sets=(), template_dirs=(), name: str | None = None, topo: str | None = None,
         maps=None, trust: bool = False) -> Loaded:
    """The lab a file (or a Mininet topology, with `topo`) describes; `trust` vouches for a Mininet
    file that root does not own alone (reading it runs it)."""
    if topo is not None:
        _no_sets(sets, template_dirs)
        return load_topology_text(mininet_yaml(file, topo, name, trust), origin(file, topo))
    if file is None:
        raise InputError(Where("labctl"), "no lab file given", "give a lab file, or --topo NAME for a Mininet topology")
    if str(file).endswith(".py"):
        raise InputError(Where(str(file)), "this is a Python file: labctl runs a Mininet topology file only "
                         "when asked to, since that executes it",
                         "name the topology in it: --topo NAME (its `topos` dictionary says which)")
    return load_topology(file, sets, template_dirs, name, maps)


def render(file: str | None, sets=(), template_dirs=(), topo: str | None = None, maps=None,
           trust: bool = False) -> str:
    if topo is not None:
        _no_sets(sets, template_dirs)
        return mininet_yaml(file, topo, None, trust)
    return render_topology(file, sets, template_dirs, maps)[0]


def origin(file: str | None, topo: str) -> str:
    """Where a Mininet lab's errors point: the lab file labctl made of it, which `render` prints."""
    render = f"labctl render {file + ' ' if file else ''}--topo {topo}"
    return f"{file} (Mininet topology {topo}, as `{render}` shows it)" if file else \
        f"Mininet topology {topo} (as `{render}` shows it)"


def _no_sets(sets, template_dirs) -> None:
    if sets or template_dirs:
        raise InputError(Where("--set" if sets else "--templates"), "--set and --templates are for labctl lab "
                         "files; a Mininet topology takes its arguments in --topo",
                         "e.g. --topo linear,k=2,n=3 (or render it to a lab file and --set that)")


def mininet_yaml(file: str | None, topo: str, name: str | None, trust: bool = False) -> str:
    """The Mininet topology as a labctl lab file (what `labctl render FILE --topo NAME` prints)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(,([A-Za-z_][A-Za-z0-9_]*=)?[A-Za-z0-9_.+-]+){0,8}", topo):
        raise InputError(Where("--topo"), f"{topo!r} is not NAME[,ARG...][,KEY=VALUE...] (as `mn --topo`)",
                         "e.g. --topo linear,3  --topo tree,depth=2,fanout=2  --topo mytopo")
    if file is not None:
        if not is_file(file):
            raise InputError(Where(str(file)), "no such Mininet topology file", "give the path to the .py file")
        if not str(file).endswith(".py"):
            raise InputError(Where(str(file)), "--topo reads a Mininet topology from a Python file (.py), and this "
                             "is not one", "drop --topo for a labctl lab file; give the .py file for a Mininet one")
    return _lab_yaml(mininet_read.read(file, topo, trust), file, topo, name)


def _tc_time(value, what: str, notes: list[str]) -> str:
    """A TCLink delay or jitter as tc reads it: Mininet hands the text to netem, where a number
    without a unit is microseconds (labctl's own bare numbers are seconds)."""
    text = str(value).strip()
    if re.fullmatch(r"[0-9]*\.?[0-9]+", text):
        notes.append(f"{what} {text} has no unit: tc, to which Mininet hands it, reads microseconds ({text}us)")
        return f"{text}us"
    return text


def _lab_yaml(mn: dict, file: str | None, topo: str, name: str | None) -> str:
    notes: list[str] = []
    names: dict[str, str] = {}
    for n in mn["hosts"] + mn["switches"]:
        ours = n.lower()
        if ours in names.values():
            raise InputError(Where(str(file) if file else "--topo"), f"nodes {n!r} and "
                             f"{next(k for k, v in names.items() if v == ours)!r} are both {ours!r} in labctl",
                             "rename one of them (labctl names are lower-case: they name namespaces)")
        names[n] = ours
        if ours != n:
            notes.append(f"node {n!r} is {ours!r} here (labctl names are lower-case)")
    for node, keys in (mn.get("ignored") or {}).items():
        notes.append(f"{names.get(node, node)}: {', '.join(keys)} not carried over (labctl numbers and routes "
                     "every host itself; a node class such as a router's or a NAT's is not run)")
    lab = name or _lab_name(file, topo)
    nodes = {names[h]: {"kind": "host"} for h in mn["hosts"]}
    nodes.update({names[s]: {"kind": "bridge"} for s in mn["switches"]})
    links = []
    for lk in mn["links"]:
        link = {"endpoints": [names.get(lk["a"], lk["a"]), names.get(lk["b"], lk["b"])]}
        if lk.get("bw"):
            link["rate"] = f"{lk['bw']}M"
        for key, ours in (("delay", "latency"), ("jitter", "jitter")):
            if lk.get(key):
                link[ours] = _tc_time(lk[key], f"link {link['endpoints'][0]}-{link['endpoints'][1]}: {key}", notes)
        if lk.get("loss"):
            link["loss"] = float(lk["loss"]) / 100
        if lk.get("ignored"):
            notes.append(f"link {link['endpoints'][0]}-{link['endpoints'][1]}: {', '.join(lk['ignored'])} not "
                         "carried over")
        links.append(link)
    doc = {"name": lab, "description": f"imported from Mininet topology {topo}" + (f" in {file}" if file else ""),
           "dilation": 1, "defaults": {"rate": MININET_DEFAULT_RATE}, "nodes": nodes, "links": links}
    # the file chose these names and option names: nothing of them may leave its comment line
    header = [printable(f"# {file or 'Mininet'} (Mininet topology {topo}), as labctl reads it")] + \
        [printable(f"# note: {n}") for n in notes]
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False)


def _lab_name(file: str | None, topo: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", ((Path(file).stem.lower() + "-") if file else "mn-") + topo.lower()).strip("-")
    stem = stem if stem[:1].isalpha() else "mn-" + stem
    return stem[:24].rstrip("-")
