"""Just enough eBPF to load labctl's own tc programs without a compiler: an assembler, the bpf()
system call through ctypes, program loading with the verifier's log, and array maps.

labctl's programs are all small enough to write as instructions: the flow hash on a router's
ingress with its load-balancing modes and the uplink depth counters (kernel/flowhash.py,
kernel/lb.py), and the arrival counters on a switch's egress (dataplane/arrivals.py). Writing them here keeps the function the one the pure model computes,
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
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_GET_NEXT_KEY, BPF_PROG_LOAD = 0, 1, 2, 4, 5
BPF_PROG_GET_FD_BY_ID, BPF_MAP_GET_FD_BY_ID, BPF_OBJ_GET_INFO_BY_FD = 13, 14, 15
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_LRU_HASH, BPF_MAP_TYPE_LPM_TRIE = 1, 2, 9, 11
BPF_F_NO_PREALLOC = 1
BPF_F_MMAPABLE = 1 << 10
BPF_PSEUDO_MAP_FD = 1
ATTR_SIZE = 128

# __sk_buff offsets (linux/bpf.h)
SKB_LEN, SKB_PKT_TYPE, SKB_PRIORITY, SKB_IFINDEX, SKB_DATA, SKB_DATA_END = 0, 4, 32, 40, 76, 80
SKB_SK = 168                # struct bpf_sock *, NULL when no socket owns the packet (5.1+)
# helpers
BPF_FUNC_MAP_LOOKUP_ELEM, BPF_FUNC_MAP_UPDATE_ELEM, BPF_FUNC_KTIME_GET_NS = 1, 2, 5
BPF_FUNC_SKB_LOAD_BYTES, BPF_FUNC_SET_HASH = 26, 48
BPF_FUNC_SKB_STORE_BYTES, BPF_FUNC_L3_CSUM_REPLACE = 9, 10
BPF_FUNC_GET_PRANDOM_U32, BPF_FUNC_CLONE_REDIRECT, BPF_FUNC_SET_HASH_INVALID, BPF_FUNC_FIB_LOOKUP = 7, 13, 41, 69
BPF_FUNC_REDIRECT, BPF_FUNC_SKB_PULL_DATA = 23, 39
BPF_ANY = 0
TC_ACT_UNSPEC = -1          # let the port's next filter (if any) classify as it would have
TC_ACT_SHOT, TC_ACT_STOLEN = 2, 4     # dropped (and counted so); consumed by the program, no drop
TC_ACT_REDIRECT = 7         # what bpf_redirect() returns: out by the port it named, after the program

# opcodes (linux/bpf_common.h): 64-bit ALU with an immediate (K) or a register (X), loads, jumps
MOV_X, MOV_K, ADD_X, ADD_K, SUB_X, SUB_K, AND_K, OR_X, XOR_X, MUL_X, MUL_K, MOD_K, LSH_K, RSH_K, NEG = \
    0xBF, 0xB7, 0x0F, 0x07, 0x1F, 0x17, 0x57, 0x4F, 0xAF, 0x2F, 0x27, 0x97, 0x67, 0x77, 0x87
AND_X, OR_K = 0x5F, 0x47
DIV_X = 0x3F                                # unsigned 64-bit; by 0 gives 0, no fault
MOV32_X = 0xBC                              # 32-bit move: the upper half cleared
BE = 0xDC                                   # to network order (a no-op on a big-endian CPU)
LDX_DW, LDX_W, LDX_H, LDX_B = 0x79, 0x61, 0x69, 0x71
STX_DW, STX_W, STX_H, STX_B = 0x7B, 0x63, 0x6B, 0x73
ATOMIC_ADD_DW = 0xDB                        # BPF_STX | BPF_ATOMIC | BPF_DW with imm BPF_ADD: lock xadd
JA, JEQ_K, JNE_K, JGT_K, JGE_K, JLT_K, JGT_X, CALL, EXIT = 0x05, 0x15, 0x55, 0x25, 0x35, 0xA5, 0x2D, 0x85, 0x95
JNE_X, JSGT_X, JGE_X = 0x5D, 0x6D, 0x3D
ARSH_K = 0xC7
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
    return _map(BPF_MAP_TYPE_ARRAY, 4, value_size, entries, name, BPF_F_MMAPABLE if mmapable else 0)


def lpm_map(entries: int, address_bytes: int, value_size: int, name: str) -> int:
    """A longest-prefix-match trie: keys are a u32 prefix length then the address (Linux 4.11)."""
    return _map(BPF_MAP_TYPE_LPM_TRIE, 4 + address_bytes, value_size, entries, name, BPF_F_NO_PREALLOC)


def lru_map(entries: int, key_size: int, value_size: int, name: str) -> int:
    """A hash map that forgets its least recently used entries when full (Linux 4.10)."""
    return _map(BPF_MAP_TYPE_LRU_HASH, key_size, value_size, entries, name)


def _map(kind: int, key_size: int, value_size: int, entries: int, name: str, flags: int = 0) -> int:
    attr = struct.pack("=IIIIIII16s", kind, key_size, value_size, entries, flags, 0, 0, name.encode()[:15])
    fd = _syscall(BPF_MAP_CREATE, attr)
    if fd < 0:
        raise BpfError(-fd, f"creating map {name}")
    return fd


# --- reading what a running lab's programs hold ---------------------------------------------------
def _elem(cmd: int, fd: int, key: bytes, value_size: int, flags: int = 0, value: bytes | None = None):
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value if value is not None else b"", max(value_size, 1))
    got = _syscall(cmd, struct.pack("=IxxxxQQQ", fd, ctypes.addressof(k), ctypes.addressof(v), flags))
    return got, v.raw[:value_size]


def lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """A map's value under `key`, or None if it has none."""
    got, value = _elem(BPF_MAP_LOOKUP_ELEM, fd, key, value_size)
    if got == -2:           # ENOENT
        return None
    if got < 0:
        raise BpfError(-got, "reading a map")
    return value


def update(fd: int, key: bytes, value: bytes) -> None:
    got, _ = _elem(BPF_MAP_UPDATE_ELEM, fd, key, len(value), BPF_ANY, value)
    if got < 0:
        raise BpfError(-got, "writing a map")


def keys(fd: int, key_size: int) -> list[bytes]:
    """Every key of a hash map (BPF_MAP_GET_NEXT_KEY from none)."""
    out, key = [], None
    while True:
        k = ctypes.create_string_buffer(key or b"", key_size)
        nxt = ctypes.create_string_buffer(key_size)
        got = _syscall(BPF_MAP_GET_NEXT_KEY, struct.pack("=IxxxxQQQ", fd, ctypes.addressof(k) if key else 0,
                                                         ctypes.addressof(nxt), 0))
        if got < 0:
            return out
        key = nxt.raw
        out.append(key)


def _by_id(cmd: int, ident: int, what: str) -> int:
    fd = _syscall(cmd, struct.pack("=III", ident, 0, 0))
    if fd < 0:
        raise BpfError(-fd, f"opening {what} {ident}")
    return fd


def _info(fd: int, size: int, fill: bytes = b"") -> bytes:
    buf = ctypes.create_string_buffer(fill.ljust(size, b"\0"), size)
    got = _syscall(BPF_OBJ_GET_INFO_BY_FD, struct.pack("=IIQ", fd, size, ctypes.addressof(buf)))
    if got < 0:
        raise BpfError(-got, "asking a BPF object about itself")
    return buf.raw


def program_maps(prog_id: int) -> dict[str, int]:
    """The maps a loaded program uses, by name: descriptors the caller closes."""
    prog = _by_id(BPF_PROG_GET_FD_BY_ID, prog_id, "program")
    try:
        ids = (ctypes.c_uint32 * 16)()
        # struct bpf_prog_info: nr_map_ids at 52, map_ids at 56 (linux/bpf.h)
        info = _info(prog, 96, bytes(52) + struct.pack("=IQ", 16, ctypes.addressof(ids)))
        count = min(16, struct.unpack_from("=I", info, 52)[0])
    finally:
        os.close(prog)
    out = {}
    for map_id in ids[:count]:
        fd = _by_id(BPF_MAP_GET_FD_BY_ID, map_id, "map")
        name = _info(fd, 40)[24:40].split(b"\0", 1)[0].decode()      # bpf_map_info.name at 24
        if name in out:
            os.close(fd)
        else:
            out[name] = fd
    return out


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


RTM_GETTFILTER, TCA_BPF_ID = 46, 11


def attached(sock, index: int, *, ingress: bool, pref: int) -> int | None:
    """The id of the BPF program filtering port `index` at `pref` (`tc filter show … ingress`), if any."""
    from labctl.kernel import netlink
    head = struct.pack("BxxxiIII", socket.AF_UNSPEC, index, 0, CLSACT_INGRESS if ingress else CLSACT_EGRESS, 0)
    request = netlink.message(RTM_GETTFILTER, netlink.NLM_F_REQUEST | netlink.NLM_F_DUMP, head)
    found = None
    for data, off, length in netlink.dump(sock, request, f"reading the filters of port {index}"):
        info = struct.unpack_from("I", data, off + 32)[0]
        attrs = netlink.parse_attrs(data[off:off + length], 36)
        options = netlink.parse_attrs(attrs.get(rtnl.TCA_OPTIONS, b""), 0)
        if info >> 16 == pref and TCA_BPF_ID in options and found is None:
            found = struct.unpack("I", options[TCA_BPF_ID][:4])[0]
    return found
