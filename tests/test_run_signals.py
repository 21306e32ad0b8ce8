"""How a test run takes SIGTERM (tests/conftest.py): the run itself unwinds as for Ctrl-C, so its
fixtures take their labs down; a fork of it (a process pool's worker, a child labctl forks) dies
of the signal, as it did before the run had a handler."""
from __future__ import annotations

import os
import signal
import time


def test_a_fork_of_the_run_dies_of_sigterm_and_unwinds_nothing():
    pid = os.fork()
    if pid == 0:                         # pragma: no cover - the fork
        try:
            time.sleep(30)
        finally:
            os._exit(7)                  # reached only if the signal unwound the fork's stack
    time.sleep(0.3)
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status


def test_the_run_itself_unwinds_on_sigterm():
    handler = signal.getsignal(signal.SIGTERM)
    assert callable(handler)
    try:
        handler(signal.SIGTERM, None)
    except KeyboardInterrupt as stop:
        assert "signal 15" in str(stop)
    else:
        raise AssertionError("SIGTERM did not unwind the run")
