"""containerlab topology files (`*.clab.yml`), read as labctl labs.

What is read, as containerlab documents it:
- `name`; `topology.nodes` with `kind`, `image`, `cmd`, `env`, `binds`, `exec`, `group`, `cap-add`
  (labctl's `cap_add:`, a powerful line) and, on an FRR node, `startup-config` (bound to
  /etc/frr/frr.conf);
- `topology.defaults`, `topology.kinds.<kind>` and `topology.groups.<group>`, inherited in that
  order (the node wins, a group may set the kind): scalars are replaced, `env` is merged, `binds`
  and `cap-add` are added, `exec` is taken from the nearest level;
- `network-mode` (host, container:...) is refused: labctl cables every node's own netns, and a node
  in the host's would be the host. One exception: a node whose kind runs by `--kind-map` and that
  shares another node's netns (`container:NODE`, as a distributed chassis's line cards share their
  control card's) is folded into that node: its ports are that node's, and a note says so;
- node names in upper case are lower-cased (labctl names namespaces after them), with a note;
- `topology.links`, brief (`endpoints: ["a:eth1", "b:eth1"]`) or extended (`type: veth` with
  `{node, interface}` endpoints);
- `mgmt`, and node keys that only concern containerlab's management network or its NOS kinds
  (`mgmt-ipv4`, `ports`, `startup-config`, ...), are ignored, each with a note in the rendered file.

Kinds: `linux` is a host (a container with an `image:`, a namespace without), `bridge` and
`ovs-bridge` an L2 bridge of labctl's own. A network OS (srl, ceos, crpd, vr-*, ...) cannot run
here: it is refused with the node, its kind, and the kind map that runs the topology's shape
instead (clabmaps.py). Public images are mapped to labctl's own (clabmaps.py), each with a note.

An FRR node (its image is, or maps to, labctl/frr) gets FRR started by an exec line when none of
its own does, as the FRR image's entrypoint does under containerlab, and IPv4 forwarding turned on
first (a container's namespace copies a Docker host's, which is on).

As in containerlab, labctl numbers nothing: every node says `addresses: none`, and the file's
`exec:` lines set addresses and routes. Links are shaped like any labctl link, at 10 Gbit/s with
no time dilation (containerlab's veths are unshaped).
"""
from __future__ import annotations

import yaml

from labctl.errors import InputError
from labctl.names import printable, split_endpoint
from labctl.topology.clabmaps import ImportMaps
from labctl.topology import clabnames
from labctl.topology.yamlpos import SourceMap

NODE_KEYS = ("kind", "image", "cmd", "env", "binds", "exec", "group", "startup-config", "cap-add", "labels")
# what each key holds, as containerlab's schema has it: checked at every level before it is used
KEY_TYPES = {"kind": (str,), "image": (str, type(None)), "cmd": (str, list), "env": (dict,), "binds": (list,),
             "exec": (list,), "group": (str, int), "startup-config": (str,), "cap-add": (list,), "labels": (dict,)}
KEY_ITEMS = {"binds": str, "exec": str, "cmd": str, "cap-add": str}
FRR_IMAGE = "labctl/frr"
FRR_START = "/usr/lib/frr/frrinit.sh start"
FORWARD = "sysctl -w net.ipv4.ip_forward=1"
# containerlab keys that mean nothing without its management network, licences or NOS images
IGNORED_NODE_KEYS = ("mgmt-ipv4", "mgmt-ipv6", "mgmt_ipv4", "mgmt_ipv6", "ports", "publish", "type",
                     "env-files", "startup-delay", "enforce-startup-config", "license", "SANs", "user",
                     "auto-remove", "wait-for", "cpu", "memory", "cpu-set", "runtime", "sandbox", "kernel",
                     "extras", "config", "dns", "certificate", "healthcheck", "stages", "restart-policy")
RATE = "10G"
SPECIAL_ENDPOINTS = ("host", "mgmt-net", "macvlan")
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


def to_labctl(data: dict, smap: SourceMap, file: str, maps: ImportMaps | None = None) -> str:
    """The labctl lab file (YAML text) a containerlab topology becomes, with its notes as comments."""
    maps = maps or ImportMaps()
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
                             "containerlab's topology has nodes:, links:, kinds:, groups:, defaults:")
    nodes = _mapping(topo.get("nodes"), smap, ("topology", "nodes"), required=True)
    kinds = _mapping(topo.get("kinds"), smap, ("topology", "kinds"))
    defaults = _mapping(topo.get("defaults"), smap, ("topology", "defaults"))
    groups = _mapping(topo.get("groups"), smap, ("topology", "groups"))
    out_nodes = {}
    renamed: dict[str, str] = {}
    shares: dict[str, tuple[str, tuple]] = {}       # a folded node: the node whose netns it shares
    taken: dict[str, str] = {}                      # every node's labctl name (folded ones too) -> as written
    for name, spec in nodes.items():
        spec = _mapping(spec, smap, ("topology", "nodes", name))
        ours = clabnames.node_name(name, smap)
        if ours in taken:
            raise InputError(smap.where(("topology", "nodes", name)), f"node {name!r} is {ours!r} in labctl, "
                             f"as node {taken[ours]!r} is", "rename one of them (labctl names are lower-case)")
        taken[ours] = name
        if ours != name:
            renamed[name] = ours
            notes.append(f"node {name!r} is {ours!r} here (labctl names are lower-case)")
        node = _node(name, spec, kinds, defaults, groups, smap, notes, maps, shares)
        if node is not None:
            out_nodes[ours] = node
    folded = _fold(shares, out_nodes, smap, notes)
    # a NOS node's port names are translated, a folded card's too (it is a mapped kind's node)
    mapped = {ours for ours, n in out_nodes.items() if n.get("description", "").startswith("containerlab kind ")}
    made = [_link(i, lk, renamed, folded, mapped | set(folded), smap, notes)
            for i, lk in enumerate(_list(topo.get("links"), smap, ("topology", "links")))]
    links = [lk for lk in made if lk is not None]
    lab = {"name": clabnames.lab_name(data.get("name"), smap, notes),
           "description": f"imported from containerlab file {file}",
           "dilation": 1, "defaults": {"rate": RATE},
           "fabrics": {"lab": {"kind": "frontend"}},
           "nodes": out_nodes, "links": links}
    header = [printable(line) for line in [f"# {file}: a containerlab topology, as labctl reads it",
                                           *(f"# note: {n}" for n in notes)]]
    return "\n".join(header) + "\n" + yaml.safe_dump(lab, sort_keys=False)


def _typed(layer: dict, at: tuple, smap: SourceMap) -> None:
    """A located error for a node key of the wrong type (exec: true, kind: [], env: a list, ...)."""
    for key, types in KEY_TYPES.items():
        if key not in layer:
            continue
        value = layer[key]
        items = KEY_ITEMS.get(key)
        if not isinstance(value, types) or (isinstance(value, list) and items and
                                            not all(isinstance(v, items) for v in value)):
            want = " or ".join("a list of strings" if t is list else {str: "a string", int: "a number", dict:
                               "a mapping", type(None): "empty"}[t] for t in types)
            raise InputError(smap.where(at + (key,)), f"{key} must be {want}, not {value!r:.60}",
                             "see containerlab's topology format")
    env = layer.get("env") or {}
    bad = [k for k, v in env.items() if not isinstance(v, (str, int, float, bool))]
    if bad:
        raise InputError(smap.where(at + ("env", bad[0])), f"env {bad[0]!r} must be a plain value",
                         "write NAME: value")


def _node(name: str, spec: dict, kinds: dict, defaults: dict, groups: dict, smap: SourceMap, notes: list[str],
          maps: ImportMaps, shares: dict) -> dict | None:
    """The node in labctl's form; None for a kind-mapped node folded into the node whose netns it
    shares (recorded in `shares`)."""
    where = ("topology", "nodes", name)
    _typed(spec, where, smap)
    _typed(defaults, ("topology", "defaults"), smap)
    group_name = spec.get("group")
    group: dict = {}
    if group_name is not None:
        if not isinstance(group_name, (str, int)):
            raise InputError(smap.where(where + ("group",)), f"node {name!r}: group must be a name",
                             "write group: NAME (a key of topology.groups, or just a label)")
        # a group that topology.groups does not define is only a label (containerlab's graph uses it)
        group = _mapping(groups.get(group_name), smap, ("topology", "groups", group_name))
        _typed(group, ("topology", "groups", group_name), smap)
    kind = spec.get("kind", group.get("kind", defaults.get("kind")))
    if kind is None:
        raise InputError(smap.where(where), f"node {name!r} has no kind",
                         "add `kind: linux` (or set it in its group or topology.defaults.kind)")
    mapped = maps.kinds.get(kind) if isinstance(kind, str) else None
    if kind not in KIND_MAP and mapped is None:
        # located where the kind was written: the node, its group, or topology.defaults
        at = where + ("kind",) if "kind" in spec else ("topology", "groups", group_name, "kind") \
            if "kind" in group else ("topology", "defaults", "kind")
        _refuse_kind(name, kind, smap.where(at))
    level = [defaults, _mapping(kinds.get(kind), smap, ("topology", "kinds", kind)), group, spec]
    _typed(level[1], ("topology", "kinds", kind), smap)
    ats = (("topology", "defaults"), ("topology", "kinds", kind), ("topology", "groups", group_name), where)
    mode = _nearest(level, "network-mode")
    if mapped and isinstance(mode, str) and mode.startswith("container:"):
        at = next(a for a, x in zip(reversed(ats), reversed(level)) if "network-mode" in x)
        shares[clabnames.node_name(name, smap)] = (mode.split(":", 1)[1], at + ("network-mode",))
        return None
    for at, layer in zip(ats, level):
        for key in layer:
            if key == "network-mode":
                raise InputError(smap.where(at + (key,)), f"network-mode: {layer[key]!r:.60} is not something labctl "
                                 "builds: labctl cables every node's own network namespace, and a node in the host's "
                                 "(host) or another container's (container:...) would be that netns, the host's "
                                 "own ports and routes in the lab", "remove network-mode: (the node gets its own "
                                 "netns, cabled by the file's links); reach the host through a link instead")
            if key in IGNORED_NODE_KEYS:
                notes.append(f"{'.'.join(map(str, at))}.{key}: ignored (containerlab only)")
            elif key not in NODE_KEYS and not mapped:
                raise InputError(smap.where(at + (key,)), f"unknown containerlab node key {key!r}",
                                 f"labctl reads {', '.join(NODE_KEYS)}, and ignores {', '.join(IGNORED_NODE_KEYS[:6])}, ...")
    if mapped:
        return _mapped_node(name, kind, mapped, level, notes)
    node: dict = {"kind": KIND_MAP[kind]}
    image = _nearest(level, "image") or None          # `image: ""` on a node: a plain namespace
    if image and node["kind"] != "bridge":
        node["image"], changed = maps.image(str(image))
        if changed:
            notes.append(f"{name}: image {image} runs as {node['image']} (no registry is used; "
                         f"--image-map {image.split(':')[0]}={image.split(':')[0]} keeps it)")
    cmd = _nearest(level, "cmd")
    if not image and node["kind"] != "bridge" and any(x.get(k) for x in level for k in ("cmd", "env", "binds")):
        notes.append(f"{name}: cmd, env and binds ignored (no image: the node is a plain namespace)")
    if cmd is not None and image:
        node["cmd"] = cmd
    env: dict = {}
    binds: list = []
    caps: list = []
    for layer in level:
        env.update({str(k): str(v) for k, v in (layer.get("env") or {}).items()})
        binds += [b for b in (layer.get("binds") or []) if b not in binds]
        caps += [c for c in (layer.get("cap-add") or []) if c not in caps]
    frr = node.get("image", "").split(":")[0] == FRR_IMAGE
    startup = _nearest(level, "startup-config")
    if startup is not None:
        if frr and isinstance(startup, str) and "\n" not in startup:
            binds.append(f"{startup}:/etc/frr/frr.conf:ro")
        else:
            notes.append(f"{name}: startup-config ignored (labctl binds it as /etc/frr/frr.conf on FRR nodes only)")
    if env and image:
        node["env"] = env
    if binds and image:
        node["binds"] = binds
    if caps and image:
        node["cap_add"] = caps       # powerful lines: listed by plan, run only for a trusted lab
    elif caps:
        notes.append(f"{name}: cap-add ignored (no image: the node is a plain namespace)")
    exec_lines = list(_nearest(level, "exec") or [])
    if frr and not any("ip_forward" in str(x) for x in exec_lines):
        # a container's namespace copies the host's IPv4 forwarding, which Docker turns on: a
        # router of a containerlab file forwards without saying so. labctl's nodes start with it off
        exec_lines.insert(0, FORWARD)
        notes.append(f"{name}: IPv4 forwarding turned on by an exec line ({FORWARD}), as a Docker host's "
                     "containers inherit it")
    if frr and not any("frrinit" in str(x) or "watchfrr" in str(x) for x in exec_lines):
        exec_lines.append(FRR_START)
        notes.append(f"{name}: FRR started by an exec line ({FRR_START}), as the FRR image's entrypoint does")
    if exec_lines:
        node["exec"] = exec_lines
    if group_name:
        node["description"] = f"group {group_name}"
    if node["kind"] != "bridge":
        node["addresses"] = "none"
    _labels(name, level, ats, node, smap, notes)
    return node


def _labels(name: str, level: list[dict], ats: tuple, node: dict, smap: SourceMap, notes: list[str]) -> None:
    """containerlab's labels, merged from defaults to node. labctl's own export writes
    `labctl.kind: gpu` with `labctl.rank` and `labctl.server` on its GPUs and `labctl.kind:
    switch` on its routers, read back here so that `labctl run` finds the ranks and the paths;
    every other label is kept as a note."""
    labels: dict = {}
    where: dict = {}
    for at, layer in zip(ats, level):
        for k, v in (layer.get("labels") or {}).items():
            labels[str(k)], where[str(k)] = v, at + ("labels", k)
    if labels.get("labctl.kind") == "gpu" and node["kind"] == "host":
        rank, server = labels.get("labctl.rank"), labels.get("labctl.server")
        if not (isinstance(rank, int) or (isinstance(rank, str) and rank.isdigit())):
            raise InputError(smap.where(where.get("labctl.rank", where["labctl.kind"])),
                             f"node {name!r}: labctl.rank must be a rank (0, 1, ...), not {rank!r:.40}",
                             "give each labctl.kind: gpu node its rank, as `labctl export --format clab` writes it")
        node.update(kind="gpu", rank=int(rank))
        if server is not None:
            node["server"] = str(server)
        for k in ("labctl.kind", "labctl.rank", "labctl.server"):
            labels.pop(k, None)
    elif labels.get("labctl.kind") == "switch" and node["kind"] == "host":
        node["kind"] = "switch"          # it routes by its exec lines (`addresses: none`), labctl's paths cross it
        labels.pop("labctl.kind")
    if labels:
        notes.append(f"{name}: labels kept as notes, not read: {', '.join(sorted(labels))}")


def _mapped_node(name: str, kind: str, target: str, level: list[dict], notes: list[str]) -> dict:
    """A network OS's node run as a Linux router, host or bridge: the links stay, its configuration does not."""
    notes.append(f"{name}: kind {kind} runs as {target} (--kind-map); its NOS configuration "
                 f"(startup-config, type, binds, exec) is not translated")
    if target == "bridge":
        return {"kind": "bridge"}
    node: dict = {"kind": "host", "addresses": "none", "description": f"containerlab kind {kind}"}
    if target == "frr":
        node.update({"image": FRR_IMAGE, "exec": [FORWARD, FRR_START]})
    return node


def _fold(shares: dict, nodes: dict, smap: SourceMap, notes: list[str]) -> dict[str, str]:
    """Each folded node's name -> the node that holds its ports (a chain of shares is followed)."""
    folded: dict[str, str] = {}
    for name, (named, at) in shares.items():
        target, seen = named, [name]
        while target.lower() in shares and target.lower() not in seen:
            seen.append(target.lower())
            target = shares[target.lower()][0]
        holder = target.lower()
        if holder in seen:
            raise InputError(smap.where(at), f"node {name!r} shares the netns of {named!r}: a circle of "
                             "network-mode: container:...", "name a node of this file that has its own netns")
        last, (last_named, last_at) = seen[-1], shares[seen[-1]]      # the share that names the holder
        if holder not in nodes:
            raise InputError(smap.where(last_at), f"node {last!r} shares the netns of {last_named!r}: no node "
                             f"{target!r} in this file", "name a node of this file that has its own netns "
                             "(network-mode: container:NODE)")
        if nodes[holder]["kind"] == "bridge":
            raise InputError(smap.where(last_at), f"node {last!r} shares the netns of {last_named!r}, a bridge: "
                             "a bridge has no netns of its own to share (containerlab's is the host's)",
                             "share the netns of a router or host node, or cable the card to the bridge")
        folded[name] = holder
        notes.append(f"{name}: shares {holder}'s network namespace (network-mode: container:{named}), so its "
                     f"ports are {holder}'s ports here")
    return folded


def _refuse_kind(name: str, kind, where) -> None:
    what = "a network OS labctl cannot run" if kind in KNOWN_NOS or str(kind).startswith("vr-") \
        else "a kind labctl does not know"
    if kind == "host":
        what, alt = "containerlab's host kind (the machine itself), which labctl never cables", \
            "a `kind: linux` node instead: labctl keeps every lab inside its own namespaces"
        raise InputError(where, f"node {name!r} is of kind {kind!r}, {what}", f"use {alt}")
    import difflib
    near = difflib.get_close_matches(str(kind), list(KIND_MAP), n=1) if what.startswith("a kind") else []
    raise InputError(where, f"node {name!r} is of kind {kind!r}, {what}",
                     (f"did you mean {near[0]!r}? Otherwise " if near else "") +
                     f"run the topology's shape with `--kind-map {kind}=frr` (a Linux router on labctl/frr) or "
                     f"`--kind-map {kind}=linux` (a plain namespace); its own configuration is not translated. "
                     f"Or use {NOS_ALTERNATIVE}")


def _nearest(level: list[dict], key: str):
    """The value of the most specific level that sets `key` (node, then kind, then defaults)."""
    return next((x[key] for x in reversed(level) if key in x), None)


def _link(i: int, lk: object, renamed: dict, folded: dict, mapped: set, smap: SourceMap,
          notes: list[str]) -> dict | None:
    """The link in labctl's form; None for a link to containerlab's host, mgmt-net or macvlan (noted).
    `renamed`: names as written -> labctl's; `folded`: a folded node -> the node holding its ports;
    `mapped`: the nodes (labctl names) whose NOS port names are translated."""
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
        if node in SPECIAL_ENDPOINTS:
            notes.append(f"links[{i}]: {end} dropped (containerlab's {node} endpoint is the machine itself; "
                         "labctl never cables it)")
            return None
        node = renamed.get(node, node)
        linux = clabnames.linux_ifname(iface) if iface else iface
        if node in mapped and linux != iface:
            notes.append(f"{node}:{iface} is port {linux} here (a NOS's name, as containerlab maps it)")
            iface = linux
        node = folded.get(node, node)
        if not iface:
            raise InputError(smap.where(where + ("endpoints", e)), f"endpoint {end!r} names no interface",
                             'containerlab endpoints are "node:interface", e.g. "srv1:eth1"')
        out.append(f"{node}:{iface}")
    link: dict = {"endpoints": out}
    if isinstance(lk.get("mtu"), int):
        link["mtu"] = min(lk["mtu"], 9000)
    return link


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
