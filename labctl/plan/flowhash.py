"""labctl's own ECMP flow hash, for kernels that cannot fix the seed of theirs.

Before Linux 6.11 there is no `fib_multipath_hash_seed`: each namespace's multipath hash is keyed
by a random seed drawn at boot, so which spine a flow takes changes from boot to boot and
`hash_seed` draws nothing. There, labctl sets each packet's flow hash itself, in a tc program on
every port of every router (kernel/flowhash.py). With `fib_multipath_hash_policy=1` a forwarded
packet that carries an L4 hash is placed by it (`skb->hash >> 1`), so the draw is this function
of the 5-tuple and the lab's seed, the same on every boot and every kernel.

This module is the function itself, written once for both sides: `program()` in the backend
emits it as eBPF instructions, and `hash32()` computes it here, so that `labctl route` can say
where the kernel will send a flow (the kernel's own `ip route get` would still use its random
seed). `select()` is the kernel's hash-threshold choice among a route's next hops.
"""
from __future__ import annotations

from dataclasses import dataclass

M64 = (1 << 64) - 1
# splitmix64's constants: odd multipliers whose products carry every input bit upward
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
TCP, UDP = 6, 17


@dataclass
class FlowHash:
    """What a router's tc program hashes: the 5-tuple (l4) or the addresses alone, under `seed`."""
    l4: bool
    seed: int


# splitmix64's finaliser, step by step (shift, then multiply; 0: none), so that every input bit
# reaches every output bit; the tc program runs the same steps
FINAL_STEPS = ((30, MIX1), (27, MIX2), (31, 0))


def finalise(x: int) -> int:
    for shift, multiplier in FINAL_STEPS:
        x ^= x >> shift
        if multiplier:
            x = (x * multiplier) & M64
    return x


def initial(fh: FlowHash) -> int:
    """The hash's starting value: the seed spread over 64 bits (a different seed, a different draw)."""
    return finalise((fh.seed * GOLDEN + (1 if fh.l4 else 0)) & M64)


def absorb(h: int, word: int) -> int:
    """One field into the hash: xor, multiply by an odd constant, fold the high half down."""
    h = ((h ^ word) * GOLDEN) & M64
    return h ^ (h >> 32)


def fields(fh: FlowHash, saddr: int, daddr: int, proto: int, sport: int, dport: int,
           fragment: bool = False) -> list[int]:
    """The words hashed, in order, as the program reads them off the packet (numbers in network order)."""
    if not fh.l4:
        return [saddr, daddr]
    ports = (sport << 16 | dport) if proto in (TCP, UDP) and not fragment else 0
    return [saddr, daddr, proto, ports]


def hash32(fh: FlowHash, saddr: int, daddr: int, proto: int, sport: int, dport: int,
           fragment: bool = False) -> int:
    """The 32-bit flow hash the program gives this packet (`skb->hash`)."""
    h = initial(fh)
    for word in fields(fh, saddr, daddr, proto, sport, dport, fragment):
        h = absorb(h, word)
    return finalise(h) & 0xFFFFFFFF


def upper_bounds(weights: list[int], usable: list[bool]) -> list[int]:
    """Each next hop's hash-threshold bound, as fib_rebalance computes it: a next hop holds the
    31-bit hashes up to its bound, and one that is down holds none (-1)."""
    total = sum(w for w, ok in zip(weights, usable) if ok)
    bounds, w = [], 0
    for weight, ok in zip(weights, usable):
        if not ok or total == 0:
            bounds.append(-1)
            continue
        w += weight
        bounds.append(((w << 31) + total // 2) // total - 1)      # DIV_ROUND_CLOSEST_ULL(w << 31, total) - 1
    return bounds


def select(h32: int, weights: list[int], usable: list[bool]) -> int | None:
    """The next hop fib_select_multipath gives a packet whose flow hash is `h32`: the first whose
    bound is at least `h32 >> 1` (None: every next hop is down)."""
    h31 = h32 >> 1
    for index, bound in enumerate(upper_bounds(weights, usable)):
        if h31 <= bound:
            return index
    return None


def select_in_group(h32: int, weights: list[int], usable: list[bool]) -> int | None:
    """The same choice in a nexthop group (nexthop_select_path_hthr, FRR's routes): bounds over
    every member whether up or not; the first usable member whose bound holds the hash, else the
    first usable one."""
    bounds = upper_bounds(weights, [True] * len(weights))
    good = [i for i, ok in enumerate(usable) if ok]
    return next((i for i in good if h32 >> 1 <= bounds[i]), good[0] if good else None)
