"""The prompt's tick (labctl/cli/tick.py), without a terminal: armed only while it waits for a
line, and what the process had on SIGALRM put back when it ends."""
from __future__ import annotations

import signal

from labctl.cli.tick import CtrlCTick


def test_the_tick_runs_only_while_waiting_and_leaves_sigalrm_as_it_found_it():
    def mine(signum, frame):
        pass
    before = signal.signal(signal.SIGALRM, mine)
    try:
        t = CtrlCTick()
        t.preloop()
        assert signal.getitimer(signal.ITIMER_REAL)[1] == CtrlCTick.TICK     # waiting: ticking
        assert signal.getsignal(signal.SIGALRM) is not mine
        assert t.precmd("nodes") == "nodes"
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)             # a command runs untouched
        assert t.postcmd(False, "nodes") is False
        assert signal.getitimer(signal.ITIMER_REAL)[1] == CtrlCTick.TICK
        t.postloop()
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) is mine                       # put back
        t.postloop()                                                         # twice (cmdloop's, cli's): harmless
        assert signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
