"""containerlab topology files (`*.clab.yml`), read as labctl labs.

What is read, as containerlab documents it:
- `name`; `topology.nodes` with `kind`, `image`, `cmd`, `env`, `binds`, `exec` and `group`;
- `topology.kinds.<kind>` and `topology.defaults`, inherited in that order (the node wins):
  scalars are replaced, `env` is merged, `binds` are added, `exec` is taken from the nearest level;
- `topology.links`, brief (`endpoints: ["a:eth1", "b:eth1"]`) or extended (`type: veth` with
  `{node, interface}` endpoints);
- `mgmt`, and node keys that only concern containerlab's management network or its NOS kinds
  (`mgmt-ipv4`, `ports`, `startup-config`, ...), are ignored, each with a note in the rendered file.

Kinds: `linux` is a host (a container with an `image:`, a namespace without), `bridge` and
`ovs-bridge` an L2 bridge of labctl's own. A network OS (srl, ceos, crpd, vr-*, ...) cannot run
here: it is refused with the node, its kind, and what to use instead.

As in containerlab, labctl numbers nothing: every node says `addresses: none`, and the file's
`exec:` lines set addresses and routes. Links are shaped like any labctl link, at 10 Gbit/s with
no time dilation (containerlab's veths are unshaped).
"""
from __future__ import annotations

import re

import yaml

from labctl.errors import InputError
from labctl.names import split_endpoint
from labctl.topology.yamlpos import SourceMap

NODE_KEYS = ("kind", "image", "cmd", "env", "binds", "exec", "group")
# containerlab keys that mean nothing without its management network, licences or NOS images
IGNORED_NODE_KEYS = ("mgmt-ipv4", "mgmt-ipv6", "mgmt_ipv4", "mgmt_ipv6", "ports", "publish", "labels", "type",
                     "startup-config", "startup-delay", "enforce-startup-config", "license", "SANs", "user",
                     "auto-remove", "wait-for", "cpu", "memory", "cpu-set", "runtime", "sandbox", "kernel",
                     "extras", "config", "dns", "certificate", "healthcheck", "stages", "restart-policy")
RATE = "10G"
KIND_MAP = {"linux": "host", "bridge": "bridge", "ovs-bridge": "bridge"}
NOS_ALTERNATIVE = ("`kind: linux` with `image: labctl/frr` and FRR configured by exec:/binds: "
                   "(a router), or labctl's own `switch` kind in a labctl lab file (routed, with PFC/ECN)")
KNOWN_NOS = ("srl", "nokia_srlinux", "ceos", "arista_ceos", "crpd", "juniper_crpd", "sonic-vs", "sonic-vm",
             "cisco_xrd", "xrd", "cisco_iol", "cisco_ftdv", "cisco_c8000", "cisco_c8000v", "juniper_cjunosevolved",
             "juniper_vjunosswitch", "juniper_vjunosrouter", "juniper_vsrx", "keysight_ixia-c-one", "ipinfusion_ocnos",
             "checkpoint_cloudguard", "fortinet_fortigate", "huawei_vrp", "openbsd", "freebsd", "6wind_vsr",
             "aruba_aoscx", "rare", "c8000", "generic_vm", "mysocketio", "ext-container", "k8s-kind", "vyosnetworks_vyos")


def is_clab(data: object) -> bool:
    """A containerlab file: its nodes and links are under `topology:`."""
    return isinstance(data, dict) and "topology" in data


def to_labctl(data: dict, smap: SourceMap, file: str) -> str:
    """The labctl lab file (YAML text) a containerlab topology becomes, with its notes as comments."""
    notes: list[str] = []
    for key in data:
        if key not in ("name", "topology", "mgmt", "prefix", "settings"):
            raise InputError(smap.where((key,)), f"unknown containerlab key {key!r}",
                             "labctl reads name:, topology: (and ignores mgmt:, prefix:, settings:)")
    for key in ("mgmt", "prefix", "settings"):
        if key in data:
            notes.append(f"{key}: ignored (labctl nodes have no management network; namespaces are <lab>-<node>)")
    topo = data["topology"]
    if not isinstance(topo, dict):
        raise InputError(smap.where(("topology",)), "topology must be a mapping", "give it nodes: and links:")
    for key in topo:
        if key not in ("nodes", "links", "kinds", "defaults", "groups"):
            raise InputError(smap.where(("topology", key)), f"unknown key {key!r} under topology",
                             "containerlab's topology has nodes:, links:, kinds:, defaults:")
    nodes = _mapping(topo.get("nodes"), smap, ("topology", "nodes"), required=True)
    kinds = _mapping(topo.get("kinds"), smap, ("topology", "kinds"))
    defaults = _mapping(topo.get("defaults"), smap, ("topology", "defaults"))
    out_nodes = {}
    for name, spec in nodes.items():
        spec = _mapping(spec, smap, ("topology", "nodes", name))
        out_nodes[_node_name(name, smap)] = _node(name, spec, kinds, defaults, smap, notes)
    links = [_link(i, lk, out_nodes, smap) for i, lk in enumerate(_list(topo.get("links"), smap,
                                                                        ("topology", "links")))]
    lab = {"name": _lab_name(data.get("name"), smap, notes),
           "description": f"imported from containerlab file {file}",
           "dilation": 1, "defaults": {"rate": RATE},
           "fabrics": {"lab": {"kind": "frontend"}},
           "nodes": out_nodes, "links": links}
    header = [f"# {file}: a containerlab topology, as labctl reads it"] + [f"# note: {n}" for n in notes]
    return "\n".join(header) + "\n" + yaml.safe_dump(lab, sort_keys=False)


def _node(name: str, spec: dict, kinds: dict, defaults: dict, smap: SourceMap, notes: list[str]) -> dict:
    where = ("topology", "nodes", name)
    kind = spec.get("kind", defaults.get("kind"))
    if kind is None:
        raise InputError(smap.where(where), f"node {name!r} has no kind", "add `kind: linux` (or set topology.defaults.kind)")
    if kind not in KIND_MAP:
        what = "a network OS labctl cannot run" if kind in KNOWN_NOS or str(kind).startswith("vr-") \
            else "a kind labctl does not know"
        if kind == "host":
            what, alt = "containerlab's host kind (the machine itself), which labctl never cables", \
                "a `kind: linux` node instead: labctl keeps every lab inside its own namespaces"
        else:
            alt = NOS_ALTERNATIVE
        raise InputError(smap.where(where + ("kind",)), f"node {name!r} is of kind {kind!r}, {what}",
                         f"use {alt}")
    level = [defaults, _mapping(kinds.get(kind), smap, ("topology", "kinds", kind)), spec]
    for i, layer in enumerate(level):
        at = (("topology", "defaults"), ("topology", "kinds", kind), where)[i]
        for key in layer:
            if key in IGNORED_NODE_KEYS:
                notes.append(f"{'.'.join(map(str, at))}.{key}: ignored (containerlab only)")
            elif key not in NODE_KEYS:
                raise InputError(smap.where(at + (key,)), f"unknown containerlab node key {key!r}",
                                 f"labctl reads {', '.join(NODE_KEYS)}, and ignores {', '.join(IGNORED_NODE_KEYS[:6])}, ...")
    node: dict = {"kind": KIND_MAP[kind]}
    image = _nearest(level, "image") or None          # `image: ""` on a node: a plain namespace
    if image and node["kind"] != "bridge":
        node["image"] = str(image)
    cmd = _nearest(level, "cmd")
    if not image and node["kind"] != "bridge" and any(x.get(k) for x in level for k in ("cmd", "env", "binds")):
        notes.append(f"{name}: cmd, env and binds ignored (no image: the node is a plain namespace)")
    if cmd is not None and image:
        node["cmd"] = cmd
    env: dict = {}
    binds: list = []
    for layer in level:
        env.update({str(k): str(v) for k, v in (layer.get("env") or {}).items()})
        binds += [b for b in (layer.get("binds") or []) if b not in binds]
    if env and image:
        node["env"] = env
    if binds and image:
        node["binds"] = binds
    exec_lines = _nearest(level, "exec")
    if exec_lines:
        node["exec"] = exec_lines
    if spec.get("group"):
        node["description"] = f"group {spec['group']}"
    if node["kind"] != "bridge":
        node["addresses"] = "none"
    return node


def _nearest(level: list[dict], key: str):
    """The value of the most specific level that sets `key` (node, then kind, then defaults)."""
    return next((x[key] for x in reversed(level) if key in x), None)


def _link(i: int, lk: object, nodes: dict, smap: SourceMap) -> dict:
    where = ("topology", "links", i)
    lk = _mapping(lk, smap, where)
    kind = lk.get("type", "veth")
    if kind != "veth":
        raise InputError(smap.where(where + ("type",)), f"link type {kind!r} is not one labctl builds",
                         "labctl builds veth links between lab nodes (no host, mgmt-net, macvlan or vxlan links)")
    ends = lk.get("endpoints")
    if not isinstance(ends, list) or len(ends) != 2:
        raise InputError(smap.where(where + ("endpoints",)), "a link has two endpoints",
                         'write endpoints: ["node1:eth1", "node2:eth1"]')
    out = []
    for e, end in enumerate(ends):
        if isinstance(end, dict):
            end = f"{end.get('node')}:{end.get('interface')}"
        node, iface = split_endpoint(str(end))
        if not iface:
            raise InputError(smap.where(where + ("endpoints", e)), f"endpoint {end!r} names no interface",
                             'containerlab endpoints are "node:interface", e.g. "srv1:eth1"')
        out.append(f"{node}:{iface}")
    link: dict = {"endpoints": out}
    if isinstance(lk.get("mtu"), int):
        link["mtu"] = min(lk["mtu"], 9000)
    return link


def _node_name(name: object, smap: SourceMap) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_-]{0,39}", name):
        raise InputError(smap.where(("topology", "nodes", name)), f"node name {name!r} is not one labctl can use",
                         "labctl names are lower-case letters, digits, '-' and '_', starting with a letter "
                         "(they name namespaces and ports)")
    return name


def _lab_name(name: object, smap: SourceMap, notes: list[str]) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InputError(smap.where(("name",)), "a containerlab topology needs a name:", "add `name: mylab`")
    fitted = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    fitted = (fitted if fitted[:1].isalpha() else "lab-" + fitted)[:24].rstrip("-")
    if fitted != name:
        notes.append(f"name {name!r} is lab {fitted!r} here (lab names are lower-case letters, digits and '-')")
    return fitted


def _mapping(value: object, smap: SourceMap, where: tuple, required: bool = False) -> dict:
    if value is None and not required:
        return {}
    if not isinstance(value, dict) or (required and not value):
        raise InputError(smap.where(where), f"{'.'.join(map(str, where))} must be a mapping"
                         + (" with at least one entry" if required else ""), "see containerlab's topology format")
    return value


def _list(value: object, smap: SourceMap, where: tuple) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(smap.where(where), f"{'.'.join(map(str, where))} must be a list", "write - endpoints: [...]")
    return value
