"""When an operation gives up (pure logic, no root): slow but moving runs go on, stopped ones end."""
from labctl.traffic.run import time_outs


def test_without_a_timeout_a_run_may_be_slow_but_not_silent():
    deadline, quiet = time_outs(None, 2.0)
    assert deadline == 100 * 2.0 + 60 and quiet == 10.0     # 2 x the bound (4 s), at least 10 s
    assert time_outs(None, 30.0) == (3060.0, 60.0)


def test_a_given_timeout_is_both_the_deadline_and_the_silence_allowed():
    assert time_outs(15_000_000_000, 2.0) == (15.0, 15.0)
