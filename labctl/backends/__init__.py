"""Backends build a LabPlan into something real. One registry; `get` is the only way in.

Adding a backend is one module with a Backend subclass and one entry here, or a call to
`register` from that module. No module outside this package imports a concrete backend.
"""
from __future__ import annotations

from labctl.errors import LabError


def _netns():
    from labctl.backends.netns import NetnsBackend
    return NetnsBackend()


def _mininet():
    from labctl.backends.mininet import MininetBackend
    return MininetBackend()


REGISTRY = {"netns": _netns, "mininet": _mininet}


def register(name: str, make) -> None:
    """Add backend `name`: `make()` returns it (a Backend). `labctl up --backend NAME` can then pick it."""
    if name in REGISTRY:
        raise ValueError(f"there is already a backend {name!r}")
    REGISTRY[name] = make


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str):
    """The backend called `name` (a labctl.backends.base.Backend)."""
    if name not in REGISTRY:
        raise LabError(f"there is no backend {name!r}", f"backends: {', '.join(REGISTRY)}")
    return REGISTRY[name]()


def available(name: str) -> str | None:
    """None if backend `name` can build on this machine, else why not."""
    return get(name).available()
