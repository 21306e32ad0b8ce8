"""Waiting for sockets or a deadline, whichever comes first, with no descriptor ceiling.

select() cannot watch a descriptor above FD_SETSIZE (1,024), and a 1,024-GPU lab gives the
controller thousands of PFC sockets. epoll has no ceiling, but its timeout counts whole
milliseconds (Python rounds up), which would stretch the controller's 1 ms loop to 2 ms and delay
the WAN line's releases. So the deadline is a timerfd in the same epoll set: nanosecond precision,
and a PFC frame or a WAN frame still wakes the waiter at once. (os.timerfd_create is Python 3.13;
labctl supports 3.11, so it is called through ctypes.)
"""
from __future__ import annotations

import ctypes
import os
import select

_libc = ctypes.CDLL(None, use_errno=True)
CLOCK_MONOTONIC = 1
TFD_NONBLOCK, TFD_CLOEXEC = 0o4000, 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Waiter:
    def __init__(self):
        self.epoll = select.epoll()
        self.timer = _libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if self.timer < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        self.epoll.register(self.timer, select.EPOLLIN)
        self.watched = 0

    def register(self, fd: int) -> None:
        self.epoll.register(fd, select.EPOLLIN)
        self.watched += 1

    def wait(self, seconds: float) -> list[int]:
        """The registered descriptors that became readable within `seconds` (0: just look)."""
        if seconds <= 0:
            return [fd for fd, _ in self.epoll.poll(0) if fd != self.timer]
        ns = max(1, int(seconds * 1e9))
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(ns // 1_000_000_000, ns % 1_000_000_000))
        if _libc.timerfd_settime(self.timer, 0, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")
        ready = []
        while not ready:
            for fd, _ in self.epoll.poll(-1):
                if fd == self.timer:
                    try:
                        os.read(self.timer, 8)
                    except BlockingIOError:
                        pass
                    return [fd for fd, _ in self.epoll.poll(0) if fd != self.timer]
                ready.append(fd)
        return ready

    def close(self) -> None:
        self.epoll.close()
        os.close(self.timer)
