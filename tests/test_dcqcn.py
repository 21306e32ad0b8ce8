"""DCQCN reaction point on a simulated clock (no root)."""
import pytest

import dcqcn_fluid
from labctl.traffic.dcqcn import Params, ReactionPoint

LINE = 100e9


def test_first_cnp_halves_the_rate_and_raises_alpha():
    rp = ReactionPoint(LINE, Params(), now=0.0)
    rp.on_cnp(1e-6)
    assert rp.rc == pytest.approx(LINE / 2) and rp.rt == LINE
    assert rp.alpha == pytest.approx(1.0)  # (1 - g) * 1 + g


def test_alpha_decays_without_cnps_so_later_cuts_are_gentler():
    p = Params()
    rp = ReactionPoint(LINE, p, now=0.0)
    rp.on_cnp(0.0)
    t = 100 * p.alpha_period + 1e-9  # just past the 100th period boundary
    rp.advance(t)
    assert rp.alpha == pytest.approx((1 - p.g) ** 99, rel=1e-3)  # the first period saw the CNP
    before = rp.rc
    rp.on_cnp(t)
    assert rp.rc == pytest.approx(before * (1 - rp_alpha_before(p) / 2), rel=1e-2)


def rp_alpha_before(p):
    return (1 - p.g) ** 99


def test_fast_recovery_halves_the_gap_each_timer_period():
    p = Params()
    rp = ReactionPoint(LINE, p, now=0.0)
    rp.on_cnp(0.0)
    gaps = []
    for k in range(1, 5):
        rp.advance(k * p.increase_period + 1e-9)
        gaps.append(rp.rt - rp.rc)
    for a, b in zip(gaps, gaps[1:]):
        assert b == pytest.approx(a / 2)


def test_additive_then_hyper_increase_recover_to_line_rate():
    p = Params()
    rp = ReactionPoint(LINE, p, now=0.0)
    for k in range(5):
        rp.on_cnp(k * 2 * p.min_cut_interval)
    low = rp.rc
    t = 5 * 2 * p.min_cut_interval
    rp.advance(t + 7 * p.increase_period)  # past fast recovery: additive increase raises the target
    assert rp.rt > low and rp.rc > low
    for k in range(2000):
        rp.on_sent(p.byte_counter, t + (8 + k) * p.increase_period)
    assert rp.rate(t + 3000 * p.increase_period) == pytest.approx(LINE)


def test_cuts_are_rate_limited_and_floored():
    p = Params()
    rp = ReactionPoint(LINE, p, now=0.0)
    rp.on_cnp(0.0)
    rp.on_cnp(p.min_cut_interval / 2)
    assert rp.cuts == 1
    for k in range(1, 200):
        rp.on_cnp(k * p.min_cut_interval)
    assert rp.rc >= p.min_rate


def test_dilation_scales_times_up_and_rates_down():
    p = Params().scaled(4000)
    assert p.alpha_period == pytest.approx(55e-6 * 4000) and p.rate_ai == pytest.approx(40e6 / 4000)
    assert p.byte_counter == 10_000_000


# The lab's bundled fabric: 400G at dilation 4000, so 100 Mbit/s and 4000x slower clocks.
LINE, DILATION = 100e6, 4000
ACCELERATED = Params(rate_ai=4e9, rate_hai=20e9, g=1 / 16, alpha_period=10e-6, increase_period=10e-6,
                     byte_counter=2_000_000, min_cut_interval=10e-6)


@pytest.mark.parametrize("seed,second_start", [(1, 0.5), (2, 0.1), (3, 1.0), (4, 0.3)])
def test_accelerated_dcqcn_shares_a_bottleneck_fairly_around_the_marking_band(seed, second_start):
    """Steps of 1% of the line per 10 µs (as workloads/dcqcn-fair.yml sets them) converge within 20%
    of an equal share in 30 s of lab time (7.5 ms of the real fabric), keeping the queue near Kmin."""
    out = dcqcn_fluid.run(ACCELERATED, LINE, DILATION, 30.0, [0.0, second_start], seed=seed)
    a, b = out.rates_bps
    assert abs(a - b) / ((a + b) / 2) < 0.2, out
    assert a + b > 0.9 * LINE, out
    assert 100_000 < out.mean_depth < 1_600_000 and out.max_depth < 3_000_000, out


def test_reference_dcqcn_steps_leave_a_400g_link_half_used_for_milliseconds():
    """With the reference steps (40 Mbit/s per 55 µs, tuned for 40G) two flows cut to a quarter
    each and recover by 0.01% of a 400G line per step: 12 s of lab time is 3 ms of real fabric."""
    out = dcqcn_fluid.run(Params(), LINE, DILATION, 12.0, [0.0, 0.5])
    assert sum(out.rates_bps) < 0.7 * LINE, out
    assert out.mean_depth < 50_000, out


def test_every_cnp_the_notification_point_sends_is_a_cut_however_the_arrivals_jitter():
    """The NP sends a QP at most one CNP per interval; arriving up to 5% early or late (the two ends'
    scheduling), each is still a cut. The RP's own guard is half the interval (traffic/run.py)."""
    import random
    from labctl.traffic.run import dcqcn_params
    from labctl.traffic.workload import Options
    o = Options(cnp=True, dcqcn=True)
    p = dcqcn_params(o)
    interval = o.cnp_interval * 1e-9
    rp = ReactionPoint(LINE, p, now=0.0)
    rng = random.Random(7)
    for k in range(1, 41):
        rp.on_cnp(k * interval + rng.uniform(-0.05, 0.05) * interval)
    assert rp.cuts == 40
