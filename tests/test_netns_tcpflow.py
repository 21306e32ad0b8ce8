"""The TCP flow runner on loopback in a namespace of the test's own: transfers arrive whole, and a run's
listener is gone when close() returns, so the next run binds the same port at once (CI once failed
with "Address already in use": close() had closed the listener while its accept thread still polled it)."""
from __future__ import annotations

import subprocess
import time

import pytest

from conftest import require_root
from labctl.kernel import nsutil
from labctl.traffic.tcpflow import FlowRun, Sequence, Target

pytestmark = pytest.mark.netns


@pytest.fixture
def loopback(lab_name):
    """A namespace of the test's own with its loopback up: (namespace, a target on it)."""
    require_root()
    ns = f"{lab_name}-tcp"
    nsutil.create(ns)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        yield ns, Target("lo", ns, "127.0.0.1")
    finally:
        nsutil.remove(ns)


def test_back_to_back_runs_reuse_the_port_and_deliver_every_byte(loopback):
    ns, target = loopback
    for attempt in range(10):
        run = FlowRun([Sequence("bulk", "lo", ns, [target], 2_000_000)]).start()
        assert run.wait(timeout=30), f"run {attempt} did not finish"
        (t,) = run.close()
        assert (t["received"], t["error"]) == (2_000_000, ""), (attempt, t)
        assert not any(th.is_alive() for th in run.acceptors), f"run {attempt}: an accept thread outlived close()"


def test_a_background_flow_runs_until_the_finite_ones_end_and_is_not_waited_for(loopback):
    """`background: true` repeats until the run ends: wait() returns once the finite flows have
    sent everything (it waited for the background one, which never ends, for ever), and close()
    stops the background one, whose transfers arrived meanwhile."""
    ns, target = loopback
    run = FlowRun([Sequence("bulk", "lo", ns, [target], 2_000_000, count=2, period=0.5),
                   Sequence("dataset", "lo", ns, [target], 500_000, None, period=0.1, offset=1)]).start()
    t0 = time.monotonic()
    assert run.wait(timeout=30), "the finite flow did not finish"
    assert time.monotonic() - t0 < 10
    transfers = run.close()
    finite = [t for t in transfers if t["flow"] == "bulk"]
    background = [t for t in transfers if t["flow"] == "dataset"]
    assert [(t["received"], t["error"]) for t in finite] == [(2_000_000, "")] * 2
    assert len(background) >= 3 and all(t["received"] == 500_000 for t in background[:-1]), background
