"""Ctrl-C at an interactive prompt's own line (cmd.Cmd over Python's readline), never lost.

CPython's readline waits in select() with no timeout and looks at signals only when select() is
interrupted: a Ctrl-C typed between the prompt's printing and that select() is seen only at the
next key (labctl cli sat 30 s in ci73 and ci81). A tick while the prompt waits interrupts
select(), and the pending KeyboardInterrupt is raised within TICK seconds. The tick restarts every
other system call (SA_RESTART): a terminal write that blocks (Ctrl-S, a slow ssh link) would
otherwise fail with EINTR and lose readline's echo. It can still end readline's short wait after
an Escape early, so a split escape sequence may read as a lone Escape. What the process had on
SIGALRM before is put back when the prompt ends.
"""
from __future__ import annotations

import signal


class CtrlCTick:
    """Mixed into a cmd.Cmd: armed in preloop and after each command, disarmed while one runs."""
    TICK = 0.1
    _before = None

    def preloop(self):
        if self._before is None:
            self._before = (signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL))
        signal.signal(signal.SIGALRM, lambda signum, frame: None)
        signal.siginterrupt(signal.SIGALRM, False)
        signal.setitimer(signal.ITIMER_REAL, self.TICK, self.TICK)

    def precmd(self, line):
        signal.setitimer(signal.ITIMER_REAL, 0)        # a node's command runs without the tick
        return line

    def postcmd(self, stop, line):
        if not stop:
            self.preloop()
        return stop

    def postloop(self):
        self.precmd("")
        if self._before is not None:
            handler, timer = self._before
            signal.signal(signal.SIGALRM, handler if handler is not None else signal.SIG_DFL)
            signal.setitimer(signal.ITIMER_REAL, *timer)
            self._before = None
