"""The WAN's model, without root: bandwidth-delay product against buffer and distance."""
from __future__ import annotations

import pytest

from labctl.plan import qos


def test_the_bdp_passes_a_2mb_buffer_at_about_4_1_km_at_400g():
    """wan-distance's break-even: 2 MB x 8 / 400 Gbit/s = 40 us round trip = 20 us one way = 4.08 km."""
    km = qos.bdp_distance_m(2_000_000, 400 * 10**9) / 1000
    assert km == pytest.approx(4.08, abs=0.01)
    assert qos.bdp_bytes(400 * 10**9, int(km * 4900)) == pytest.approx(2_000_000, rel=1e-3)
