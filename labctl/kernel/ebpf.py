"""Just enough eBPF to load labctl's own tc programs without a compiler: an assembler, the bpf()
system call through ctypes, program loading with the verifier's log, and array maps.

labctl has two programs, both small enough to write as instructions: the ECMP flow hash on a
router's ingress (kernel/flowhash.py) and the arrival counters on a switch's egress
(dataplane/arrivals.py). Writing them here keeps the function the one the pure model computes,
and needs neither clang nor libbpf on the machine.
"""
from __future__ import annotations

import ctypes
import os
import platform
import socket
import struct
import sys

from labctl.kernel import rtnl

_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
BPF_MAP_CREATE, BPF_PROG_LOAD = 0, 5
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_MAP_TYPE_ARRAY = 2
BPF_F_MMAPABLE = 1 << 10
BPF_PSEUDO_MAP_FD = 1
ATTR_SIZE = 128

# __sk_buff offsets (linux/bpf.h)
SKB_LEN, SKB_PRIORITY, SKB_DATA, SKB_DATA_END = 0, 32, 76, 80
# helpers
BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_SET_HASH = 1, 48
TC_ACT_UNSPEC = -1          # let the port's next filter (if any) classify as it would have

# opcodes (linux/bpf_common.h): 64-bit ALU with an immediate (K) or a register (X), loads, jumps
MOV_X, MOV_K, ADD_X, ADD_K, AND_K, OR_X, XOR_X, MUL_X, LSH_K, RSH_K = \
    0xBF, 0xB7, 0x0F, 0x07, 0x57, 0x4F, 0xAF, 0x2F, 0x67, 0x77
BE = 0xDC                                   # to network order (a no-op on a big-endian CPU)
LDX_W, LDX_H, LDX_B = 0x61, 0x69, 0x71
STX_W = 0x63
ATOMIC_ADD_DW = 0xDB                        # BPF_STX | BPF_ATOMIC | BPF_DW with imm BPF_ADD: lock xadd
JA, JEQ_K, JNE_K, JGT_K, JLT_K, JGT_X, CALL, EXIT = 0x05, 0x15, 0x55, 0x25, 0xA5, 0x2D, 0x85, 0x95
R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)


def supported() -> bool:
    """Whether this CPU's bpf() system call number is known here."""
    return platform.machine() in _BPF_SYSCALL


class Asm:
    """Instructions, labels and forward jumps."""

    def __init__(self):
        self.code: list = []

    def op(self, code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0):
        self.code.append((code, dst, src, off, imm))

    def jump(self, code: int, dst: int, label: str, src: int = 0, imm: int = 0):
        self.code.append((code, dst, src, label, imm))

    def label(self, name: str):
        self.code.append(name)

    def ld64(self, dst: int, value: int):
        self.code.append(("ld64", dst, value, 0))

    def ld_map(self, dst: int, map_fd: int):
        """The map behind a descriptor, as the verifier rewrites it into the map's address."""
        self.code.append(("ld64", dst, map_fd, BPF_PSEUDO_MAP_FD))

    def assemble(self) -> bytes:
        where, slot = {}, 0
        for item in self.code:
            if isinstance(item, str):
                where[item] = slot
            else:
                slot += 2 if item[0] == "ld64" else 1
        out, slot = [], 0
        for item in self.code:
            if isinstance(item, str):
                continue
            if item[0] == "ld64":
                _, dst, value, src = item
                out += [_insn(0x18, dst, src, 0, _s32(value & 0xFFFFFFFF)), _insn(0, 0, 0, 0, _s32(value >> 32))]
                slot += 2
                continue
            code, dst, src, off, imm = item
            slot += 1
            if isinstance(off, str):
                off = where[off] - slot
            out.append(_insn(code, dst, src, off, imm))
        return b"".join(out)


def _s32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def _insn(code: int, dst: int, src: int, off: int, imm: int) -> bytes:
    regs = (src << 4 | dst) if sys.byteorder == "little" else (dst << 4 | src)
    return struct.pack("=BBhi", code, regs, off, imm)


class BpfError(OSError):
    """The kernel refused: errno, and the verifier's log for a program."""

    def __init__(self, err: int, what: str, log: str = ""):
        super().__init__(err, f"{what}: {os.strerror(err)}" + (f": {log}" if log else ""))
        self.log = log


def _syscall(cmd: int, attr: bytes) -> int:
    nr = _BPF_SYSCALL.get(platform.machine())
    if nr is None:
        raise BpfError(38, f"bpf() on a {platform.machine()} CPU")      # ENOSYS
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(ATTR_SIZE))
    return fd if fd >= 0 else -ctypes.get_errno()


def load_program(code: bytes, name: str, prog_type: int = BPF_PROG_TYPE_SCHED_CLS) -> int:
    """A loaded program's descriptor (the caller closes it once something holds the program).
    The verifier's log is asked for only when it refuses, to say why."""
    insns = ctypes.create_string_buffer(code, len(code))
    licence = ctypes.create_string_buffer(b"GPL")     # bpf_set_hash is a GPL-only helper
    log = ctypes.create_string_buffer(1 << 16)
    err = 0
    for level in (0, 1):
        attr = struct.pack("=IIQQIIQII16s", prog_type, len(code) // 8, ctypes.addressof(insns),
                           ctypes.addressof(licence), level, len(log) if level else 0,
                           ctypes.addressof(log) if level else 0, 0, 0, name.encode()[:15])
        fd = _syscall(BPF_PROG_LOAD, attr)
        if fd >= 0:
            return fd
        err = -fd
    raise BpfError(err, f"loading {name}", log.value.decode(errors="replace")[-400:])


def array_map(entries: int, value_size: int, name: str, mmapable: bool = False) -> int:
    """An array map's descriptor; `mmapable` lets the reader map its values into memory and read
    them with no system call (Linux 5.5)."""
    attr = struct.pack("=IIIIIII16s", BPF_MAP_TYPE_ARRAY, 4, value_size, entries,
                       BPF_F_MMAPABLE if mmapable else 0, 0, 0, name.encode()[:15])
    fd = _syscall(BPF_MAP_CREATE, attr)
    if fd < 0:
        raise BpfError(-fd, f"creating map {name}")
    return fd


# --- attaching a program to a port (`tc qdisc add … clsact; tc filter add … bpf da`) ---------------
RTM_NEWTFILTER = 44
TC_H_CLSACT, CLSACT_HANDLE, CLSACT_INGRESS, CLSACT_EGRESS = 0xFFFFFFF1, 0xFFFF0000, 0xFFFFFFF2, 0xFFFFFFF3
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT = 6, 7, 8, 1
ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800


def clsact_requests(index: int, prog_fd: int, name: str, where: str, what: str, *, ingress: bool,
                    protocol: int, pref: int = 1, handle: int = 0,
                    flags: int = rtnl.CREATE) -> list[tuple[tuple[int, int, bytes], str]]:
    """clsact on port `index` and the program `prog_fd` as a direct-action filter on its ingress or
    egress, as rtnl.Batch requests. `flags` rtnl.CREATE refuses a port that has them already;
    without NLM_F_EXCL a second attach replaces its own filter."""
    qdisc = rtnl._tcmsg(index, CLSACT_HANDLE, TC_H_CLSACT) + rtnl.attr(rtnl.TCA_KIND, rtnl.cstr("clsact"))
    parent = CLSACT_INGRESS if ingress else CLSACT_EGRESS
    head = struct.pack("BxxxiIII", socket.AF_UNSPEC, index, handle, parent, pref << 16 | socket.htons(protocol))
    options = rtnl.nest(rtnl.TCA_OPTIONS, rtnl.attr(TCA_BPF_FD, rtnl.u32(prog_fd)),
                        rtnl.attr(TCA_BPF_NAME, rtnl.cstr(name)),
                        rtnl.attr(TCA_BPF_FLAGS, rtnl.u32(TCA_BPF_FLAG_ACT_DIRECT)))
    return [((rtnl.RTM_NEWQDISC, flags, qdisc), f"{where}: clsact"),
            ((RTM_NEWTFILTER, flags, head + rtnl.attr(rtnl.TCA_KIND, rtnl.cstr("bpf")) + options), f"{where}: {what}")]
