"""Port names as labctl derives them (labctl/names.py), without root."""
def test_a_node_named_lo_or_br0_gives_its_peers_ports_another_name():
    """A Mininet host named lo made a port named lo beside the loopback, and a switch named br0
    one beside a bridge node's bridge: plan passed and up failed with "File exists"."""
    from labctl.names import assign_ifnames
    assert assign_ifnames([("lo", None, "s1", None), ("s1", None, "br0", None)]) == [("s1", "lo-2"), ("br0-2", "s1")]


def test_with_several_labs_up_the_fix_offers_each_not_the_first_by_name(monkeypatch):
    """User trial: with another user's lab up, `labctl tc set ...` said "e.g. --lab clfrr01", the
    other user's lab, first by name; copying it would have changed their lab."""
    import pytest
    from types import SimpleNamespace
    from labctl import state
    from labctl.errors import LabError
    from labctl.lifecycle import labs
    monkeypatch.setattr(state, "all_labs", lambda: [SimpleNamespace(name="clfrr01"), SimpleNamespace(name="ls")])
    with pytest.raises(LabError) as err:
        labs.default_lab(None)
    assert err.value.fix.startswith("say which: --lab clfrr01 or --lab ls (")


def test_a_node_named_as_a_containerlab_file_wrote_it_is_found():
    """containerlab trial: `labctl exec PC1` was refused: the import had named the node pc1."""
    from pathlib import Path
    import pytest
    from labctl.errors import LabError
    from labctl.lifecycle import targets
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    plan = compile_plan(load_topology(Path(__file__).resolve().parents[1] / "topologies" / "leaf-spine.yml"))
    assert targets.node(plan, "LEAF1").name == "leaf1" and targets.node(plan, "Srv1-GPU0").name == "srv1-gpu0"
    with pytest.raises(LabError):
        targets.node(plan, "leaf9")
