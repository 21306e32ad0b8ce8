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


def test_marking_levels_follow_the_profile_in_few_steps():
    depths = range(0, 2_000_000, 1_000)
    levels = [ecn.level(d, KMIN, KMAX, PMAX) for d in depths]
    assert len(set(levels)) <= ecn.RAMP_STEPS + 2       # 0, the ramp's steps, and 1.0 above Kmax
    for d, n in zip(depths, levels):
        p = qos.marking_probability(d, KMIN, KMAX, PMAX)
        assert abs(n / ecn.SCALE - p) <= PMAX * 0.75 / ecn.RAMP_STEPS + 1 / 1024, d  # dead band from 0
    assert ecn.level(KMIN - 1, KMIN, KMAX, PMAX) == 0 and ecn.level(KMAX + 1, KMIN, KMAX, PMAX) == ecn.SCALE


def test_a_queue_hovering_at_a_level_edge_keeps_its_level():
    step = (KMAX - KMIN) // ecn.RAMP_STEPS
    edge = KMIN + 4 * step + step // 2                 # between levels 4 and 5
    n4 = ecn.level(edge - 1_000, KMIN, KMAX, PMAX)
    n5 = ecn.level(edge + 1_000, KMIN, KMAX, PMAX)
    assert n4 < n5
    assert ecn.level(edge + 1_000, KMIN, KMAX, PMAX, current=n4) == n4   # inside the dead band
    assert ecn.level(edge - 1_000, KMIN, KMAX, PMAX, current=n5) == n5
    assert ecn.level(edge + step // 2, KMIN, KMAX, PMAX, current=n4) == n5  # a quarter step past the edge
    assert ecn.level(KMIN - 1, KMIN, KMAX, PMAX, current=n5) == 0           # below Kmin: never marks


def test_chain_rules():
    assert ecn.chain_rules(5, 3, 0) == "flush chain ip labctl ecn_5_3\n"
    assert "numgen random mod 65536 < 6554 ip ecn set ce" in ecn.chain_rules(5, 3, 6554)
    assert "numgen" not in ecn.chain_rules(5, 3, ecn.SCALE) and "ip ecn set ce" in ecn.chain_rules(5, 3, ecn.SCALE)
    assert "oif 5 meta priority 1:13 jump ecn_5_3" in ecn.setup_rules([(5, 3, 0x13)])


def test_the_warm_up_uses_every_marking_expression_and_leaves_the_chain_empty():
    rules = ecn.warm_up_rules(5, 3, "bridge")
    assert "numgen random mod 65536 < 1 ip ecn set ce counter name" in rules
    assert rules.strip().splitlines()[-1] == "flush chain bridge labctl ecn_5_3"
