"""The README's recipes for a new backend and a new node kind hold: each is written in one place
(here, one test file), registered with one call, and a lab names and plans it (no root)."""
from __future__ import annotations

from pathlib import Path

import pytest

from labctl import backends, kinds
from labctl.backends.base import Backend
from labctl.errors import InputError
from labctl.lifecycle.build import plan_for
from labctl.topology.load import load_topology

LAB = """\
name: toy
nodes:
  sw1: {kind: switch}
  probe1: {kind: %s}
  gpu0: {kind: gpu}
links:
  - {endpoints: [gpu0, sw1], rate: 10G}
  - {endpoints: [probe1, sw1], rate: 10G}
"""


class ToyBackend(Backend):
    """Builds nothing; refuses a plan with more than `limit` nodes, as a real one refuses what it cannot build."""
    name = "toy"
    description = "a backend that only checks"
    limit = 3

    def check(self, plan):
        if len(plan.nodes) > self.limit:
            return [("nodes", f"toy builds at most {self.limit} nodes, the lab has {len(plan.nodes)}",
                     "remove a node")]
        return []


@pytest.fixture
def toy_backend():
    backends.register("toy", ToyBackend)
    yield
    del backends.REGISTRY["toy"]


@pytest.fixture
def probe_kind():
    kinds.register(kinds.NodeKind("probe", "a measurement host on the fabric", end_host=True,
                                  shape="diamond", group="probes", backends=("netns", "toy")))
    yield
    del kinds.NODE_KINDS["probe"]


def _lab(tmp_path: Path, kind: str) -> Path:
    f = tmp_path / "toy.yml"
    f.write_text(LAB % kind)
    return f


def test_a_registered_kind_and_backend_plan_a_lab(tmp_path, toy_backend, probe_kind):
    plan, builder = plan_for(load_topology(_lab(tmp_path, "probe")), "toy")
    assert isinstance(builder, ToyBackend) and "toy" in backends.names()
    probe = plan.node("probe1")
    assert probe.kind == "probe" and probe.interfaces and probe.interfaces[0].address   # an end host: addressed
    assert not probe.forwarding
    # an end host like a GPU: it reaches the fabric through the switch, with the GPU's routes
    sw_port = next(i for i in plan.node("sw1").interfaces if i.peer_node == "probe1")
    assert [(r.dst, [h.via for h in r.nexthops]) for r in probe.routes] == \
        [(r.dst, [sw_port.address.split("/")[0]]) for r in plan.node("gpu0").routes]


def test_the_backend_checks_the_plan_before_anything_is_built(tmp_path, toy_backend, probe_kind):
    f = _lab(tmp_path, "probe")
    ToyBackend.limit = 2
    try:
        with pytest.raises(InputError, match="toy builds at most 2 nodes") as info:
            plan_for(load_topology(f), "toy")
        assert info.value.where.file == str(f)
    finally:
        ToyBackend.limit = 3


def test_a_kind_names_the_backends_that_build_it(tmp_path, toy_backend, probe_kind):
    with pytest.raises(InputError, match="backend 'mininet' cannot build a probe node"):
        plan_for(load_topology(_lab(tmp_path, "probe")), "mininet")


def test_an_unregistered_kind_is_a_located_error(tmp_path):
    f = _lab(tmp_path, "probe")
    with pytest.raises(InputError, match="not a node kind") as info:
        load_topology(f)
    assert info.value.where.line == 4, str(info.value)
