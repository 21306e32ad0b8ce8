"""Backends apply a LabPlan to something real. Explicit registry, no string-built lookups."""
from __future__ import annotations


def backends() -> dict:
    from labctl.backends.netns import NetnsBackend
    return {"netns": NetnsBackend}
