"""A small eBPF interpreter for labctl's hand-assembled tc programs: runs a program on a packet
without root or a kernel, so the tests can compare what it computes with the pure model
(plan/flowhash.py). It knows the instructions and helpers labctl's programs use, no more; an
unknown opcode or a read outside every region is an error, not a guess."""
from __future__ import annotations

import struct

M64 = (1 << 64) - 1
STACK, PACKET, CTX, VALUES = 0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000
SIZES = {0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}     # BPF_W, BPF_H, BPF_B, BPF_DW


class ArrayMap:
    def __init__(self, entries: int, value_size: int):
        self.value_size = value_size
        self.values = {k: bytearray(value_size) for k in range(entries)}

    def get(self, key: bytes) -> bytearray | None:
        return self.values.get(struct.unpack("<I", key)[0])

    def put(self, key: bytes, value: bytes) -> None:
        self.values[struct.unpack("<I", key)[0]][:] = value


class HashMap:
    def __init__(self, value_size: int):
        self.value_size = value_size
        self.values: dict[bytes, bytearray] = {}

    def get(self, key: bytes) -> bytearray | None:
        return self.values.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.values[bytes(key)] = bytearray(value)


class LpmMap:
    """BPF_MAP_TYPE_LPM_TRIE over IPv4: keys are a u32 prefix length then the address."""
    key_size = 8

    def __init__(self, prefixes: list[str] = ()):
        import ipaddress
        self.nets = [ipaddress.ip_network(p, strict=False) for p in prefixes]
        self.value = bytearray(b"\1")

    def get(self, key: bytes) -> bytearray | None:
        import ipaddress
        length = struct.unpack_from("<I", key)[0]
        addr = ipaddress.ip_address(bytes(key[4:8]))
        found = [n for n in self.nets if n.prefixlen <= length and addr in n]
        return self.value if found else None


class Skb:
    """What the program sees: the frame from its Ethernet header, and __sk_buff's fields."""

    def __init__(self, frame: bytes, linear: int | None = None):
        self.frame = bytes(frame)
        self.linear = len(frame) if linear is None else linear     # data_end: the rest is in frags
        self.hash: int | None = None
        self.mark = 0                                            # __sk_buff.mark, which tc may write
        self.pkt_type = 0                                        # PACKET_HOST
        self.ifindex = 1                                         # the port it arrived on
        self.priority = 0                                        # which tc may write
        self.sk = 0                                              # __sk_buff.sk: the owning socket, or NULL
        self.redirected: tuple[int, int] | None = None           # bpf_clone_redirect(ifindex, flags)
        self.cloned = False                                      # by bpf_clone_redirect, not bpf_redirect
        self.hash_cleared = False                                # bpf_set_hash_invalid()
        self.written = False                                     # bpf_skb_store_bytes() changed it


class Vm:
    def __init__(self, maps: dict[int, object] | None = None, clock=lambda: 0, fib=None, prandom=lambda: 0):
        self.maps = maps or {}
        self.clock = clock
        self.prandom = prandom
        self.fib = fib          # bpf_fib_lookup: fib(params: bytearray of 64) -> return code, params filled

    def run(self, code: bytes, skb: Skb) -> int:
        insns = [struct.unpack_from("<BBhi", code, k) for k in range(0, len(code), 8)]
        regions = {STACK: bytearray(512), PACKET: bytearray(skb.frame), CTX: bytearray(256)}
        struct.pack_into("<I", regions[CTX], 0, len(skb.frame))
        struct.pack_into("<I", regions[CTX], 8, skb.mark)
        struct.pack_into("<I", regions[CTX], 4, skb.pkt_type)
        struct.pack_into("<I", regions[CTX], 32, skb.priority)
        struct.pack_into("<I", regions[CTX], 40, skb.ifindex)
        struct.pack_into("<I", regions[CTX], 76, PACKET)
        struct.pack_into("<I", regions[CTX], 80, PACKET + skb.linear)
        struct.pack_into("<Q", regions[CTX], 168, skb.sk)
        value_at: dict[int, int] = {}          # address of a map value -> its region
        r = [0] * 11
        r[1], r[10] = CTX, STACK + 512
        pc = 0

        def region(addr: int, size: int) -> tuple[bytearray, int]:
            for base, mem in regions.items():
                if base <= addr and addr + size <= base + len(mem):
                    if base == PACKET and addr + size > PACKET + skb.linear:
                        break
                    return mem, addr - base
            raise AssertionError(f"access of {size} bytes at {addr:#x}: outside every region")

        def load(addr: int, size: int) -> int:
            mem, off = region(addr, size)
            return int.from_bytes(mem[off:off + size], "little")

        def store(addr: int, size: int, value: int) -> None:
            mem, off = region(addr, size)
            mem[off:off + size] = (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")

        def value_address(m, key: bytes) -> int:
            v = m.get(key)
            if v is None:
                return 0
            for base, mem in regions.items():
                if mem is v:
                    return base
            base = VALUES + 0x1000 * len(value_at)
            regions[base] = v
            value_at[base] = base
            return base

        def call(helper: int) -> int:
            if helper == 1:                                  # map_lookup_elem(map, key)
                m = self.maps[r[1]]
                size = getattr(m, "key_size", 4)
                mem, off = region(r[2], size)
                return value_address(m, bytes(mem[off:off + size]))
            if helper == 2:                                  # map_update_elem(map, key, value, flags)
                m = self.maps[r[1]]
                kmem, koff = region(r[2], 4)
                vmem, voff = region(r[3], m.value_size)
                m.put(bytes(kmem[koff:koff + 4]), bytes(vmem[voff:voff + m.value_size]))
                return 0
            if helper == 7:                                  # get_prandom_u32()
                return self.prandom() & 0xFFFFFFFF
            if helper == 5:                                  # ktime_get_ns()
                return self.clock()
            if helper == 26:                                 # skb_load_bytes(skb, offset, to, len)
                off, n = r[2], r[4]
                if off + n > len(skb.frame):
                    return (-14) & M64
                for i in range(n):
                    store(r[3] + i, 1, skb.frame[off + i])
                return 0
            if helper == 9:                                  # skb_store_bytes(skb, offset, from, len, flags)
                off, n = r[2], r[4]
                if off + n > len(regions[PACKET]):
                    return (-14) & M64
                regions[PACKET][off:off + n] = bytes(load(r[3] + i, 1) for i in range(n))
                skb.written = True
                return 0
            if helper == 10:                                 # l3_csum_replace(skb, offset, from, to, 2)
                assert r[5] == 2, "only 16-bit replacements are known here"
                off = r[2]
                old = int.from_bytes(regions[PACKET][off:off + 2], "little")
                # csum_replace2(), in the memory order the values were loaded in
                total = (~old & 0xFFFF) + (~r[3] & 0xFFFF) + (r[4] & 0xFFFF)
                while total >> 16:
                    total = (total & 0xFFFF) + (total >> 16)
                regions[PACKET][off:off + 2] = (~total & 0xFFFF).to_bytes(2, "little")
                return 0
            if helper == 69:                                 # fib_lookup(skb, params, 64, flags)
                assert r[3] == 64 and self.fib is not None
                mem, off = region(r[2], 64)
                params = bytearray(mem[off:off + 64])
                rc = self.fib(params)
                mem[off:off + 64] = params
                return rc
            if helper == 13:                                 # clone_redirect(skb, ifindex, flags)
                skb.redirected, skb.cloned = (r[2] & 0xFFFFFFFF, r[3]), True
                skb.frame = bytes(regions[PACKET])           # the clone: the packet as it is now
                return 0
            if helper == 23:                                 # redirect(ifindex, flags)
                skb.redirected = (r[1] & 0xFFFFFFFF, r[2])
                skb.frame = bytes(regions[PACKET])
                return 7                                     # TC_ACT_REDIRECT
            if helper == 39:                                 # skb_pull_data(skb, len)
                if r[2] > len(skb.frame):
                    return (-14) & M64                       # -EFAULT
                skb.linear = max(skb.linear, r[2])
                struct.pack_into("<I", regions[CTX], 80, PACKET + skb.linear)
                return 0
            if helper == 41:                                 # set_hash_invalid(skb)
                skb.hash, skb.hash_cleared = None, True
                return 0
            if helper == 48:                                 # set_hash(skb, hash)
                skb.hash = r[2] & 0xFFFFFFFF
                return 0
            raise AssertionError(f"helper {helper} is not known here")

        def signed(v: int) -> int:
            return v - (1 << 64) if v >> 63 else v

        steps = 0
        while True:
            steps += 1
            assert steps < 100_000, "the program does not end"
            op, regs, off, imm = insns[pc]
            dst, src = regs & 0xF, regs >> 4
            pc += 1
            cls = op & 0x07
            k = imm & M64                                    # sign-extended immediate
            if op == 0x18:                                   # ld64 (a map's descriptor: its handle)
                r[dst] = (imm & 0xFFFFFFFF) | (insns[pc][3] & 0xFFFFFFFF) << 32
                pc += 1
            elif cls == 0x07 or op in (0xBC, 0xDC):          # ALU64 (and MOV32, BE)
                x = r[src] if op & 0x08 else k
                code = op & 0xF0
                a = r[dst]
                if op == 0xBC:
                    r[dst] = r[src] & 0xFFFFFFFF
                    continue
                if op == 0xDC:
                    width = imm // 8
                    r[dst] = int.from_bytes((a & ((1 << imm) - 1)).to_bytes(width, "little"), "big")
                    continue
                r[dst] = {0x00: lambda: a + x, 0x10: lambda: a - x, 0x20: lambda: a * x,
                          0x40: lambda: a | x, 0x50: lambda: a & x, 0x60: lambda: a << (x & 63),
                          0x70: lambda: a >> (x & 63), 0x80: lambda: -a, 0x90: lambda: a % x if x else a,
                          0x30: lambda: a // x if x else 0,
                          0xA0: lambda: a ^ x, 0xB0: lambda: x,
                          0xC0: lambda: signed(a) >> (x & 63)}[code]() & M64
            elif cls == 0x01:                                # LDX
                r[dst] = load(r[src] + off, SIZES[op & 0x18])
            elif cls == 0x03:                                # STX, and the atomic add
                size = SIZES[op & 0x18]
                if op & 0xE0 == 0xC0:
                    assert imm == 0, "only atomic add is known here"
                    store(r[dst] + off, size, load(r[dst] + off, size) + r[src])
                else:
                    store(r[dst] + off, size, r[src])
            elif cls == 0x05:                                # JMP
                code = op & 0xF0
                if code == 0x80:
                    r[0] = call(imm)
                    continue
                if code == 0x90:
                    skb.mark = struct.unpack_from("<I", regions[CTX], 8)[0]
                    skb.priority = struct.unpack_from("<I", regions[CTX], 32)[0]
                    skb.frame = bytes(regions[PACKET])
                    return signed(r[0])
                a, x = r[dst], (r[src] if op & 0x08 else k)
                taken = {0x00: True, 0x10: a == x, 0x50: a != x, 0x20: a > x, 0x30: a >= x, 0xA0: a < x,
                         0xB0: a <= x, 0x60: signed(a) > signed(x), 0x70: signed(a) >= signed(x),
                         0xC0: signed(a) < signed(x)}[code]
                if taken:
                    pc += off
            else:
                raise AssertionError(f"opcode {op:#x} is not known here")
