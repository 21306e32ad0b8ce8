"""Two hosts, each on its own switch, the switches joined: the shape of Mininet's custom example,
in the `mn --custom` convention (`topos` names the classes). Used by tests/test_netns_mininet.py:

    labctl up tests/topologies/mininet/topo-2sw-2host.py --topo mytopo
"""
from mininet.topo import Topo


class TwoSwitchTwoHost(Topo):
    def build(self):
        left, right = self.addHost("h1"), self.addHost("h2")
        s1, s2 = self.addSwitch("s3"), self.addSwitch("s4")
        self.addLink(left, s1)
        self.addLink(s1, s2, bw=100, delay="2ms")
        self.addLink(s2, right)


topos = {"mytopo": TwoSwitchTwoHost}
