"""Port names as labctl derives them (labctl/names.py), without root."""
def test_a_node_named_lo_or_br0_gives_its_peers_ports_another_name():
    """A Mininet host named lo made a port named lo beside the loopback, and a switch named br0
    one beside a bridge node's bridge: plan passed and up failed with "File exists"."""
    from labctl.names import assign_ifnames
    assert assign_ifnames([("lo", None, "s1", None), ("s1", None, "br0", None)]) == [("s1", "lo-2"), ("br0-2", "s1")]
