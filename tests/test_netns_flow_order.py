"""Flows stay in order across the lab's hops: every port steers received packets by flow hash (RPS).

Without it a veth hands each packet to the backlog of whichever CPU transmitted it, and the incast's
NVLink peers arrived with 1-5 packets swapped per run under CPU load."""
from __future__ import annotations

import subprocess

import pytest

from conftest import require_root
from labctl.kernel import nsutil, rps
from test_netns_lab import LEAF_SPINE

pytestmark = pytest.mark.netns


def test_every_port_of_a_built_lab_steers_by_flow_hash(built_lab):
    require_root()
    plan = built_lab(LEAF_SPINE)
    want = rps.cpu_mask()
    for name in ("leaf1", "srv1-nvs", "srv2-gpu3"):
        node = plan.node(name)
        masks = rps.read_masks(str(nsutil.path(node.namespace)), [i.name for i in node.interfaces])
        assert set(masks) == {i.name for i in node.interfaces}
        assert all(int(m, 16) == int(want, 16) for ms in masks.values() for m in ms), masks


def test_the_sysfs_path_sets_a_port_for_kernels_without_a_default_mask(lab_name):
    """The portable path, exercised here even though this kernel has the per-namespace default."""
    require_root()
    ns = f"{lab_name}-rps"
    nsutil.create(ns)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=True)
        path = str(nsutil.path(ns))
        assert {int(m, 16) for m in rps.read_masks(path, ["p0"])["p0"]} == {0}
        rps.set_on_devices(path, ["p0"], "1")
        assert {int(m, 16) for m in rps.read_masks(path, ["p0"])["p0"]} == {1}
        assert {int(m, 16) for m in rps.read_masks(path, ["p1"])["p1"]} == {0}
    finally:
        nsutil.remove(ns)
