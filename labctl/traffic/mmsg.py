"""recvmmsg(2) through ctypes: up to 64 datagrams, their source addresses and IP ToS per syscall.

Python's socket module has no recvmmsg; one recvmsg per 4 KB frame tops out near the rate at
which the fabric delivers, so receivers batch (measured ~2x recv_into, docs/design.md §8).
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket

MSG_WAITFORONE = 0x10000
SLOT = 9216          # a jumbo frame's payload fits
NAME = 16            # sockaddr_in
CONTROL = 32         # one cmsg holding IP_TOS (1 byte, padded)
TOS_AT = ctypes.sizeof(ctypes.c_size_t) + 8     # CMSG_DATA: after cmsg_len (a size_t), level and type

_libc = ctypes.CDLL(None, use_errno=True)


class _iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(_iovec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _msghdr), ("msg_len", ctypes.c_uint)]


_libc.recvmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_mmsghdr), ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_libc.recvmmsg.restype = ctypes.c_int


class Receiver:
    """Reads batches from a UDP socket; `recv()` returns (count, views, sources, tos values)."""

    def __init__(self, sock: socket.socket, batch: int = 64):
        self.sock, self.batch = sock, batch
        self.data = (ctypes.c_char * (SLOT * batch))()
        self.names = (ctypes.c_char * (NAME * batch))()
        self.control = (ctypes.c_char * (CONTROL * batch))()
        self.iov = (_iovec * batch)()
        self.msgs = (_mmsghdr * batch)()
        base = ctypes.addressof(self.data)
        for i in range(batch):
            self.iov[i].iov_base = base + i * SLOT
            self.iov[i].iov_len = SLOT
            h = self.msgs[i].msg_hdr
            h.msg_name = ctypes.addressof(self.names) + i * NAME
            h.msg_iov = ctypes.pointer(self.iov[i])
            h.msg_iovlen = 1
            h.msg_control = ctypes.addressof(self.control) + i * CONTROL
        self.view = memoryview(self.data).cast("B")
        self.name_view = memoryview(self.names).cast("B")
        self.control_view = memoryview(self.control).cast("B")
        self.fd = sock.fileno()

    def recv(self) -> int:
        """Block (up to the socket's timeout) for at least one datagram; return how many arrived."""
        for i in range(self.batch):
            h = self.msgs[i].msg_hdr
            h.msg_namelen = NAME
            h.msg_controllen = CONTROL
        n = _libc.recvmmsg(self.fd, self.msgs, self.batch, MSG_WAITFORONE, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return 0
            raise OSError(err, os.strerror(err))
        return n

    def headers(self):
        """numpy views of every slot's BTH, length, source and ToS (rxbatch.Headers), for reading
        a whole batch at once."""
        from labctl.traffic.rxbatch import Headers
        return Headers(self.data, SLOT, self.batch, self.msgs, ctypes.sizeof(_mmsghdr), _mmsghdr.msg_len.offset,
                       _msghdr.msg_controllen.offset, self.names, NAME, self.control, CONTROL, TOS_AT)

    def length(self, i: int) -> int:
        return self.msgs[i].msg_len

    def payload(self, i: int) -> memoryview:
        return self.view[i * SLOT:i * SLOT + self.msgs[i].msg_len]

    def source(self, i: int) -> bytes:
        return bytes(self.name_view[i * NAME + 4:i * NAME + 8])

    def tos(self, i: int) -> int:
        if self.msgs[i].msg_hdr.msg_controllen <= TOS_AT:
            return 0
        return self.control_view[i * CONTROL + TOS_AT]
