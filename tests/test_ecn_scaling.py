"""ECN thresholds per port: the profile's bytes, or, with a reference rate, scaled by the link's rate."""
from __future__ import annotations

import pytest

from labctl.dataplane import control
from labctl.plan import qos
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology_text

TOPOLOGY = """\
name: ecnscale
dilation: 1000
qos: {{ecn: {{kmin: 400KB, kmax: 1600KB{extra}}}}}
nodes:
  h1: {{kind: host}}
  s1: {{kind: switch}}
  h2: {{kind: host}}
links:
  - {{endpoints: [h1, s1], rate: 400G}}
  - {{endpoints: [s1, h2], rate: 25G}}
"""


def thresholds(extra: str) -> dict[str, tuple[int, int]]:
    plan = compile_plan(load_topology_text(TOPOLOGY.format(extra=extra), "ecnscale.yml"))
    s1 = plan.node("s1")
    out = {}
    for iface in s1.interfaces:
        (roce,) = [c for c in iface.shaping.classes if c.ecn]
        st = control.settings_for(plan, s1, iface, roce, {})    # what the controller applies
        assert (st.kmin, st.kmax) == (roce.kmin_bytes, roce.kmax_bytes)
        out[iface.peer_node] = (st.kmin, st.kmax)
    return out


def test_thresholds_scale_with_the_link_rate_relative_to_the_profiles_rate():
    assert thresholds(", rate: 100G") == {"h1": (1_600_000, 6_400_000), "h2": (100_000, 400_000)}
    # DCQCN's deployment values (5 KB / 200 KB at 40G) at 400G: ten times both
    assert qos.ecn_thresholds(5_000, 200_000, 400 * 10**9, 40 * 10**9) == (50_000, 2_000_000)


def test_without_a_reference_rate_every_port_marks_at_the_same_bytes():
    assert thresholds("") == {"h1": (400_000, 1_600_000), "h2": (400_000, 1_600_000)}


def test_a_queue_at_kmin_drains_in_the_same_time_at_every_rate():
    for rate in (25e9, 100e9, 400e9, 800e9):
        kmin, _ = qos.ecn_thresholds(400_000, 1_600_000, int(rate), 100 * 10**9)
        assert kmin * 8 / rate == pytest.approx(400_000 * 8 / 100e9, rel=1e-6)

