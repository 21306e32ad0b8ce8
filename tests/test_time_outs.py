"""When an operation gives up (pure logic, no root): slow but moving runs go on, stopped ones end."""
import pytest

from labctl.traffic.run import time_outs


def test_without_a_timeout_a_run_may_be_slow_but_not_silent():
    deadline, quiet = time_outs(None, 2.0)
    assert deadline == 100 * 2.0 + 60 and quiet == 10.0     # 2 x the bound (4 s), at least 10 s
    assert time_outs(None, 30.0) == (3060.0, 60.0)


def test_a_given_timeout_is_both_the_deadline_and_the_silence_allowed():
    assert time_outs(15_000_000_000, 2.0) == (15.0, 15.0)


def test_a_traffic_agent_that_answered_and_ended_does_not_spoil_the_others_answers():
    """On `exit` each traffic agent writes its counters and ends; another, slower rank may still be
    writing its own. Its end must not be taken for a rank that failed to answer: that once
    dropped every rank's counters, and the run reported nothing sent and nothing received."""
    import queue
    from labctl.traffic.pool import AgentPool
    pool = AgentPool.__new__(AgentPool)
    pool.ranks = [0, 1]
    pool.events = queue.Queue()
    for event in [(0, {"event": "counters", "tx": [1]}), (0, {"event": "exited", "code": 0}),
                  (1, {"event": "counters", "tx": [2]})]:
        pool.events.put(event)
    got = pool._collect("counters", 2, timeout=1)
    assert {r: m["tx"] for r, m in got.items()} == {0: [1], 1: [2]}
    # an agent that ends before it answers is still an error, naming it
    pool.events.put((1, {"event": "exited", "code": 1}))
    with pytest.raises(Exception, match="rank 1 exited"):
        pool._collect("counters", 2, timeout=1)
