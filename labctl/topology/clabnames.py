"""containerlab's names as labctl's: node names (they name namespaces), the lab's name, and a
network OS's port names as Linux ones, as containerlab maps them."""
from __future__ import annotations

import re

from labctl.errors import InputError
from labctl.topology.yamlpos import SourceMap


def linux_ifname(name: str) -> str:
    """A NOS's port name as a Linux one, as containerlab writes SR Linux's: ethernet-1/1 -> e1-1."""
    n = re.sub(r"^ethernet-?", "e", name, flags=re.I) if re.match(r"ethernet-?\d", name, re.I) else name
    return re.sub(r"[^A-Za-z0-9._-]", "-", n)[:15]


def node_name(name: object, smap: SourceMap) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_-]{0,39}", name.lower()):
        raise InputError(smap.where(("topology", "nodes", name)), f"node name {name!r} is not one labctl can use",
                         "labctl names are lower-case letters, digits, '-' and '_', starting with a letter "
                         "(they name namespaces and ports)")
    return name.lower()


def lab_name(name: object, smap: SourceMap, notes: list[str]) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InputError(smap.where(("name",)), "a containerlab topology needs a name:", "add `name: mylab`")
    fitted = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    fitted = (fitted if fitted[:1].isalpha() else "lab-" + fitted)[:24].rstrip("-")
    if fitted != name:
        notes.append(f"name {name!r} is lab {fitted!r} here (lab names are lower-case letters, digits and '-')")
    return fitted
