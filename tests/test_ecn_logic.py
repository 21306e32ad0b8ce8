"""The ECN profile and its nftables form (pure)."""
import pytest

from labctl.dataplane import ecn
from labctl.plan import qos

KMIN, KMAX, PMAX = 400_000, 1_600_000, 0.2


@pytest.mark.parametrize("depth,p", [(0, 0), (399_999, 0), (400_000, 0), (1_000_000, 0.1), (1_600_000, 0.2),
                                     (1_600_001, 1.0), (4_000_000, 1.0)])
def test_probability_profile(depth, p):
    assert qos.marking_probability(depth, KMIN, KMAX, PMAX) == pytest.approx(p)


def test_threshold_quantises_and_saturates():
    assert ecn.threshold(0) == 0 and ecn.threshold(1.0) == ecn.SCALE
    assert abs(ecn.threshold(0.1) / ecn.SCALE - 0.1) < 1 / 1024


def test_chain_rules():
    assert ecn.chain_rules(5, 3, 0) == "flush chain ip labctl ecn_5_3\n"
    assert "numgen random mod 65536 < 6554 ip ecn set ce" in ecn.chain_rules(5, 3, 6554)
    assert "numgen" not in ecn.chain_rules(5, 3, ecn.SCALE) and "ip ecn set ce" in ecn.chain_rules(5, 3, ecn.SCALE)
    assert "oif 5 meta priority 1:13 jump ecn_5_3" in ecn.setup_rules([(5, 3, 0x13)])
