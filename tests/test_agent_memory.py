"""An agent in each node must fit in this host's memory: `up` and `plan` refuse a lab whose agents
would not, before anything is built, with the count, the need and the fix (no root needed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from labctl import procs
from labctl.errors import InputError
from labctl.lifecycle.build import plan_for
from labctl.plan import share
from labctl.topology import sources

ROOT = Path(__file__).resolve().parents[1]
LAB = str(ROOT / "topologies" / "leaf-spine.yml")
BIG = ("servers=128", "gpus_per_server=8", "leaves=32", "spines=16")     # bench/scale.py's 1,024 GPUs


@pytest.fixture(scope="module")
def big_plan():
    return plan_for(sources.load(LAB, BIG, (), "lbig", None, None))[0]


def test_one_agent_for_the_lab_is_never_refused(big_plan, monkeypatch):
    monkeypatch.delenv(share.PLACEMENT_ENV, raising=False)
    assert share.memory_refusal(big_plan, 2**20) is None


def test_an_agent_in_each_of_1200_nodes_is_refused_on_24_gib(big_plan, monkeypatch):
    monkeypatch.setenv(share.PLACEMENT_ENV, "node")
    served = len(share.served(big_plan))
    assert served == 1200                   # every switch and every GPU host has lossless classes
    reason, fix = share.memory_refusal(big_plan, 23 * 2**30)
    assert f"each of {served} nodes" in reason and "37.5 GiB" in reason and "23.0 GiB available" in reason
    assert share.PLACEMENT_ENV in fix and "'lab'" in fix


def test_the_bundled_lab_fits_and_a_small_host_does_not(monkeypatch):
    monkeypatch.setenv(share.PLACEMENT_ENV, "node")
    plan = plan_for(sources.load(LAB, (), (), "lsmall", None, None))[0]
    need = len(share.served(plan)) * share.AGENT_MIB * 2**20
    assert share.memory_refusal(plan, 24 * 2**30) is None
    assert share.memory_refusal(plan, need) is not None      # past 80% of what is there
    assert share.memory_refusal(plan, int(need / 0.8) + 1) is None


def test_this_hosts_memory_is_read():
    assert procs.mem_available() > 2**30


def test_up_refuses_at_the_environment_key_before_anything_is_built(monkeypatch):
    monkeypatch.setenv(share.PLACEMENT_ENV, "node")
    monkeypatch.setattr(procs, "mem_available", lambda: 2**28)            # 256 MiB
    with pytest.raises(InputError) as err:
        plan_for(sources.load(LAB, (), (), "lsmall", None, None))
    assert share.PLACEMENT_ENV in str(err.value)
    assert "0.2 GiB available" in str(err.value)


def test_a_placed_lab_is_told_to_place_fewer_nodes(monkeypatch):
    monkeypatch.delenv(share.PLACEMENT_ENV, raising=False)
    plan = plan_for(sources.load(LAB, (), (), "lplaced", None, None))[0]
    plan.nodes[0].machine = "m1"          # a placed lab runs an agent in each node whatever the variable
    reason, fix = share.memory_refusal(plan, 2**28)
    assert "placed lab" in fix and share.PLACEMENT_ENV not in fix
