"""What runs inside a node beyond labctl's own plumbing: its container, and its exec lines.

Both come from the lab file as text and run as root, so they are checked here, at plan time, with
the file's line: commands are split as a shell would split them (no shell ever runs them), and a
bind mount names an absolute host path (a relative one is taken from the lab file's directory, as
containerlab does).
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from labctl.errors import InputError
from labctl.plan import model
from labctl.topology.schema import NodeSpec
from labctl.topology.templates import render_file
from labctl.topology.yamlpos import SourceMap

BIND_MODES = ("ro", "rw")
# never mounted into a node, even with --trust: the host's system trees (a node holding one holds the host)
SYSTEM_TREES = ("/etc", "/proc", "/sys", "/dev", "/boot", "/root")
RUNTIME_SOCKETS = ("docker.sock", "containerd.sock", "podman.sock", "crio.sock", "dockershim.sock",
                   "cri-dockerd.sock", "buildkitd.sock")
RUNTIME_DIRS = ("/run/docker", "/var/run/docker", "/run/containerd", "/var/run/containerd", "/run/podman",
                "/var/lib/docker", "/var/lib/containerd", "/var/lib/labctl/machines")
# the engines of machines labctl emulates (cluster/emulate.py): /run/lcm-m1.sock, /run/lcm-m1/...
EMULATED_ENGINES = ("/run/lcm-", "/var/run/lcm-")


def container_name(lab: str, node: str) -> str:
    """The Docker container of a node: `labctl-<lab>-<node>`, as containerlab's `clab-<lab>-<node>`."""
    return f"labctl-{lab}-{node}"


def argv(text: str, smap: SourceMap, key: tuple) -> list[str]:
    try:
        out = shlex.split(text)
    except ValueError as exc:
        raise InputError(smap.where(key), f"cannot split {text!r} into a command: {exc}",
                         "close the quote; the line is split as a shell would, and no shell runs it") from None
    if not out:
        raise InputError(smap.where(key), "an empty command", "remove the line or write the command")
    return out


def exec_lines(name: str, node: NodeSpec, smap: SourceMap) -> list[list[str]]:
    return [argv(line, smap, ("nodes", name, "exec", i)) for i, line in enumerate(node.exec)]


def container(lab: str, name: str, node: NodeSpec, lab_file: Path, smap: SourceMap) -> model.Container | None:
    if node.image is None:
        for key in ("cmd", "env", "binds", "files", "privileged", "cap_add"):
            if getattr(node, key):
                raise InputError(smap.where(("nodes", name, key)), f"node {name!r} has {key}: but no image:",
                                 f"{key}: configures a container: add `image:` (e.g. labctl/host, see "
                                 "`labctl image list`), or remove it"
                                 + (" (a node without an image is a namespace of this machine's, whose "
                                    "privileges are root's already)" if key in ("privileged", "cap_add") else ""))
        return None
    cmd = node.cmd
    if isinstance(cmd, str):
        cmd = argv(cmd, smap, ("nodes", name, "cmd"))
    binds = [_bind(text, lab_file, smap, ("nodes", name, "binds", i)) for i, text in enumerate(node.binds)]
    return model.Container(container_name(lab, name), node.image, cmd, dict(node.env), binds,
                           privileged=node.privileged, cap_add=list(dict.fromkeys(node.cap_add)))


def files(b) -> None:
    """The compile pass that renders each container node's files (after routes: the templates see
    the node as planned, with its addresses and peers)."""
    t = b.topo
    root = b.loaded.template_root or b.loaded.file.resolve().parent
    for name, spec in t.nodes.items():
        node = b.nodes[name]
        for path, source in spec.files.items():
            where = b.smap.where(("nodes", name, "files", path))
            if ".." in path.split("/"):
                raise InputError(where, f"{path!r} is not a plain path", "write an absolute path without '..'")
            if isinstance(source, str):
                text = source
            else:
                text = render_file(root, source.template, {"node": node_view(b, node), "lab": t.name,
                                                           "dilation": t.dilation, **source.vars}, where)
            node.container.files.append({"path": path, "text": text})


def binds_apart(b) -> None:
    """The compile pass that refuses a bind whose host path lies inside a bind some node may write:
    that node's container could swap a directory on the way for a symlink (to /) before the
    engine mounts the inner one, which would then mount whatever the link names."""
    held = [(Path(text.split(":")[0]), text.split(":")[2:] == ["ro"], name, i, text)
            for name, node in b.nodes.items() if node.container for i, text in enumerate(node.container.binds)]
    for inner, _, name, i, text in held:
        for outer, read_only, holder, _, _ in held:
            if not read_only and inner != outer and inner.is_relative_to(outer):
                raise InputError(b.smap.where(("nodes", name, "binds", i)),
                                 f"the bind {text!r} lies inside {outer}, which {holder} mounts read-write: its "
                                 "container could put a symlink on the way before this one is mounted",
                                 f"bind a path no node can write, or mount {holder}'s bind read-only (:ro)")


def binds_exist(b) -> None:
    """The compile pass that refuses a bind whose host path does not exist, as containerlab does
    before it deploys: the engine would make it an empty directory of root's in the lab's
    directory, mount that, and leave it behind (a startup-config: of a containerlab file is one)."""
    for name, node in b.nodes.items():
        for i, text in enumerate(node.container.binds if node.container else ()):
            host = text.split(":")[0]
            if not os.path.lexists(host):
                raise InputError(b.smap.where(("nodes", name, "binds", i)), f"the bind's host path {host} does "
                                 "not exist", "create it, or correct the path (a relative one is from the lab "
                                 "file's directory)")


def node_view(b, node: model.Node) -> dict:
    """What a node file template sees of its node."""
    def port(i: model.Interface) -> dict:
        peer = b.nodes[i.peer_node]
        return {"name": i.name, "address": i.address, "ip": i.address.split("/")[0], "peer": i.peer_node,
                "peer_ip": i.peer_address, "peer_kind": peer.kind, "peer_switch": peer.forwarding,
                "fabric": i.fabric}
    return {"name": node.name, "kind": node.kind, "fabric": node.fabric, "loopback": node.loopback or "",
            "loopback_ip": (node.loopback or "").split("/")[0], "interfaces": [port(i) for i in node.interfaces]}


def _bind(text: str, lab_file: Path, smap: SourceMap, key: tuple) -> str:
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in BIND_MODES):
        raise InputError(smap.where(key), f"{text!r} is not a bind mount",
                         "write host-path:container-path, or host-path:container-path:ro")
    host, inside = parts[0], parts[1]
    if not inside.startswith("/"):
        raise InputError(smap.where(key), f"the container path {inside!r} is not absolute",
                         "write it from the container's root, e.g. ./frr.conf:/etc/frr/frr.conf")
    lab_dir = lab_file.resolve().parent
    given = Path(host) if host.startswith("/") else (lab_dir / host)
    resolved = given.resolve()
    _refuse_dangerous(str(resolved), smap.where(key), text)
    literal = host.startswith("/") and ".." not in host.split("/") and str(resolved) == os.path.normpath(host)
    if not literal and not resolved.is_relative_to(lab_dir):
        raise InputError(smap.where(key), f"the bind {text!r} leaves the lab's directory through "
                         f"{'a symlink' if '..' not in host.split('/') else '..'} (it is {resolved})",
                         "name the host path literally, as an absolute path with no symlink or '..', if you "
                         "mean it; labctl never follows a relative path or link out of the lab's directory")
    return ":".join([str(resolved), inside, *parts[2:]])


def _refuse_dangerous(path: str, where, text: str) -> None:
    """The binds no lab gets, trusted or not."""
    name = os.path.basename(path)
    if path == "/" or any(path == t or path.startswith(t + "/") for t in SYSTEM_TREES):
        raise InputError(where, f"the bind {text!r} mounts the host's {path if path == '/' else path.split('/')[1]}"
                         " tree: a node holding it holds the host", "bind a file of the lab's own directory instead "
                         "(e.g. ./frr.conf:/etc/frr/frr.conf:ro); labctl refuses this even with --trust")
    if name in RUNTIME_SOCKETS or any(path == d or path.startswith(d + "/") for d in RUNTIME_DIRS) \
            or path.startswith(EMULATED_ENGINES):
        raise InputError(where, f"the bind {text!r} hands a container runtime ({path}) to the node: whoever "
                         "runs in it can start containers as root on this machine",
                         "remove it; labctl refuses a runtime's socket or state even with --trust")
