"""The waiter the controller and the WAN line sleep in: descriptors above FD_SETSIZE, and deadlines
finer than epoll's milliseconds (no root)."""
from __future__ import annotations

import os
import select
import time

import pytest

from labctl.procs import raise_fd_limit
from labctl.wakeup import Waiter


def test_a_descriptor_above_fd_setsize_wakes_the_waiter_where_select_cannot_watch_it():
    raise_fd_limit(4096)
    pipes = [os.pipe() for _ in range(700)]          # 1,400 descriptors: the last ones are above 1,024
    try:
        r, w = pipes[-1]
        assert r > 1024
        with pytest.raises(ValueError):
            select.select([r], [], [], 0)             # what the controller used to do
        waiter = Waiter()
        waiter.register(r)
        assert waiter.wait(0) == []
        os.write(w, b"x")
        t0 = time.monotonic()
        assert waiter.wait(5.0) == [r]
        assert time.monotonic() - t0 < 1.0           # at once, not at the deadline
        waiter.close()
    finally:
        for a, b in pipes:
            os.close(a)
            os.close(b)


def test_a_deadline_is_kept_to_well_under_a_millisecond():
    waiter = Waiter()
    late = []
    for _ in range(50):
        t0 = time.monotonic()
        assert waiter.wait(0.0003) == []
        late.append(time.monotonic() - t0 - 0.0003)
    waiter.close()
    late.sort()
    assert min(late) >= 0                            # never early
    assert late[len(late) // 2] < 0.0005, late       # the median wake is not rounded up to 1 ms
