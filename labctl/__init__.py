"""labctl: a miniature AI-training network built from Linux namespaces.

    from labctl import Lab, Topology      # the Python API (labctl/api.py)
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # lazily: `import labctl` (every helper process does) must not load the whole API
    if name == "Lab":
        from labctl.api import Lab
        return Lab
    if name == "Topology":
        from labctl.topology.builder import Topology
        return Topology
    if name == "PingResult":
        from labctl.api import PingResult
        return PingResult
    raise AttributeError(f"module 'labctl' has no attribute {name!r}")
