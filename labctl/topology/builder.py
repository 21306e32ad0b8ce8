"""A lab written in Python instead of YAML: the same keys, checked exactly like a file.

    t = Topology("mylab", dilation=4000)
    t.add_switch("leaf1")
    t.add_gpu("gpu0", server="srv1")
    t.add_link("gpu0", "leaf1", rate="400G")
    Lab(t).up()

Every add_* takes the keyword arguments the YAML node or link takes (see the README's "Topology
format"); nothing is checked until the lab is loaded, and then an error names the line of the
YAML this builder wrote (`t.yaml()` shows it).
"""
from __future__ import annotations

import yaml


class Topology:
    def __init__(self, name: str, dilation: float | None = None, **top):
        self.doc: dict = {"name": name, **({"dilation": dilation} if dilation is not None else {}), **top,
                          "nodes": {}, "links": []}

    @property
    def name(self) -> str:
        return self.doc["name"]

    def add_node(self, name: str, kind: str, **fields) -> str:
        self.doc["nodes"][name] = {"kind": kind, **fields}
        return name

    def add_switch(self, name: str, **fields) -> str:
        return self.add_node(name, "switch", **fields)

    def add_router(self, name: str, **fields) -> str:
        return self.add_node(name, "router", **fields)

    def add_bridge(self, name: str, **fields) -> str:
        return self.add_node(name, "bridge", **fields)

    def add_gpu(self, name: str, **fields) -> str:
        return self.add_node(name, "gpu", **fields)

    def add_host(self, name: str, **fields) -> str:
        return self.add_node(name, "host", **fields)

    def add_storage(self, name: str, **fields) -> str:
        return self.add_node(name, "storage", **fields)

    def add_fabric(self, name: str, kind: str, **fields) -> str:
        self.doc.setdefault("fabrics", {})[name] = {"kind": kind, **fields}
        return name

    def add_link(self, a: str, b: str, **fields) -> dict:
        """A link between two nodes (`node` or `node:port`); rate, latency, distance, ... as in YAML."""
        link = {"endpoints": [a, b], **fields}
        self.doc["links"].append(link)
        return link

    def yaml(self) -> str:
        return yaml.safe_dump(self.doc, sort_keys=False)

