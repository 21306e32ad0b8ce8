"""Names the kernel will see: namespaces, interface names (≤ 15 chars) and MAC addresses.

Ports are named after the node at the other end (`leaf1` on a spine is the port toward leaf1), so
`ip -n lab-spine1 link` reads like a cabling sheet. A second parallel link gets `-2`, and so on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

IFNAME_MAX = 15  # IFNAMSIZ - 1

IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
LAB_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")   # the topology schema's rule for a lab's name:
# every namespace labctl makes (<lab>-<node>, <lab>-wire3.a): never a path, never "." or ".."
NAMESPACE_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,254}$")


def namespace(lab: str, node: str) -> str:
    """`<lab>-<node>`, so `ip netns exec <lab>-<node> …` works without labctl."""
    return f"{lab}-{node}"


NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")   # the schema's Name: never a path


def valid_node_name(name: object) -> bool:
    return isinstance(name, str) and NODE_NAME_RE.fullmatch(name) is not None


def valid_lab_name(name: object) -> bool:
    return isinstance(name, str) and LAB_NAME_RE.fullmatch(name) is not None


def valid_namespace(name: object, lab: str | None = None) -> bool:
    """A name labctl could have given a namespace (of lab `lab`, if given); records are checked
    with it before anything acts on a name they hold."""
    return (isinstance(name, str) and NAMESPACE_RE.fullmatch(name) is not None and ".." not in name
            and (lab is None or name.startswith(lab + "-")))


def mac(node_index: int, port_index: int) -> str:
    """Locally administered, unique within a lab, stable across runs (02:1a:NN:NN:PP:PP)."""
    return "02:1a:%02x:%02x:%02x:%02x" % (node_index >> 8 & 255, node_index & 255,
                                           port_index >> 8 & 255, port_index & 255)


@dataclass
class NamingError(Exception):
    link: int
    end: int
    message: str
    fix: str


KERNEL_NAMES = ("lo", "br0")     # devices a node's namespace has besides its ports


def split_endpoint(text: str) -> tuple[str, str | None]:
    node, sep, iface = str(text).partition(":")
    return node.strip(), (iface.strip() if sep else None)


def assign_ifnames(links: list[tuple[str, str | None, str, str | None]]) -> list[tuple[str, str]]:
    """Interface names for each link's two ends: explicit names first, then peer-named ports.

    `links` holds (node_a, iface_a or None, node_b, iface_b or None) in file order.
    """
    used: dict[str, set[str]] = {}
    for i, (a, ia, b, ib) in enumerate(links):
        for end, (node, iface) in enumerate(((a, ia), (b, ib))):
            if iface is None:
                continue
            if not IFNAME_RE.match(iface) or iface == "lo":
                raise NamingError(i, end, f"{iface!r} is not a usable interface name",
                                  "use 1-15 letters, digits, '.', '-' or '_' (and not 'lo')")
            if iface in used.setdefault(node, set()):
                raise NamingError(i, end, f"interface {node}:{iface} is used by two links",
                                  "give one of them another interface name")
            used[node].add(iface)
    out = []
    for i, (a, ia, b, ib) in enumerate(links):
        names = []
        for end, (node, iface, peer) in enumerate(((a, ia, b), (b, ib, a))):
            if iface is None:
                # a peer named lo or br0 must not name a port after itself: those are the node's
                # loopback and a bridge node's bridge (kernel/netconf.py), made in every namespace
                iface = _free_name(peer, used.setdefault(node, set()) | set(KERNEL_NAMES))
                if len(iface) > IFNAME_MAX:
                    raise NamingError(
                        i, end,
                        f"the port on {node!r} toward {peer!r} would be named {iface!r} "
                        f"({len(iface)} characters); Linux allows at most {IFNAME_MAX}",
                        f"shorten the node name {peer!r}, or name the port: `{node}:eth1`")
                used[node].add(iface)
            names.append(iface)
        out.append((names[0], names[1]))
    return out


def _free_name(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    k = 2
    while f"{base}-{k}" in taken:
        k += 1
    return f"{base}-{k}"


def terminal_safe(text: str) -> str:
    """`text` with every control character but newline and tab written out (ESC as \\x1b): for text
    from outside (an engine's error, a container's output) printed to the user's terminal, which
    would otherwise act on it (move the cursor, rewrite earlier lines, set the window title)."""
    return "".join(c if c.isprintable() or c in "\n\t" else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else
                                                            f"\\u{ord(c):04x}") for c in str(text))


def printable(text: str) -> str:
    """`text` with every character that is not printable (a newline above all) as '?': for a lab
    author's words written into a comment line of a file labctl then reads as YAML."""
    return "".join(c if c.isprintable() else "?" for c in text)
