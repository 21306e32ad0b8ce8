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

A lab whose routing names `lb:` runs the same program on every router, whatever the kernel, with
a load-balancing mode per router (docs/load-balancing.md): the hash the program gives a packet is
then one of these functions of the 5-tuple and what the program remembers:

- `ecmp`: `hash32` of the 5-tuple;
- `ecmp-qp`: of the 5-tuple and, for RoCEv2 (UDP 4791), the BTH destination QP (`qp=`);
- `flowlet`: of the 5-tuple and the flow's flowlet number, which counts up when the flow paused
  for longer than the gap (`flowlet_hash`);
- `spray`: packet k of a flow goes to uplink (flow's hash + k) mod n, n the router's uplinks
  (`spray_hash`; a link of weight w counts w times): strict round robin, each flow starting at
  its own uplink. A router whose
  multipath routes differ in their next hops has no one set to count round: there the hash is
  the flow's plus k times 2^32/φ, which walks any number of next hops' ranges in turn within a
  packet or two;
- `adaptive`: the hash that sends the packet to the next hop whose queue is shallowest
  (`adaptive_pick`, `steer_targets`).

A router with WAN traffic-engineering rules (`te:`, plan/te.py) runs the same program with one
more step before the hash: the first rule whose DSCP set and destination port match the packet
sets its mark (`te_mark`), and the kernel's policy routing sends a marked packet to the rule's
own table, which holds the same routes over the rule's paths only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

M64 = (1 << 64) - 1
# splitmix64's constants: odd multipliers whose products carry every input bit upward
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
M32 = (1 << 32) - 1
TCP, UDP = 6, 17
ROCE_PORT = 4791
MODES = ("ecmp", "ecmp-qp", "flowlet", "spray", "adaptive")
# 2^32 / the golden ratio: the multiples of it modulo 2^32 fall as evenly over [0, 2^32) as any
# sequence can (the three-distance theorem), so packet k's hash lands in each of n equal ranges
# once per n packets, up to one, for any n: round robin without knowing the next hops
WEYL = 0x9E3779B9


@dataclass
class TeMatch:
    """What one te: rule tests, as the program tests it: the packet's DSCP in `dscp` (or, with
    `negate`, in none of them: the class that takes everything else), and, when `dport` is not
    0, an unfragmented TCP or UDP packet to that port. A match sets the packet's mark to `mark`."""
    dscp: list[int]
    negate: bool
    dport: int
    mark: int


@dataclass
class FlowHash:
    """What a router's tc program hashes: the 5-tuple (l4) or the addresses alone, under `seed`;
    in a lab with `lb:`, how the router balances (`mode`, None without `lb:`), the flowlet gap in
    lab nanoseconds, and the ports of its multipath next hops in the routes' order (`group`, with
    their `weights`): the uplinks whose depths `adaptive` compares."""
    l4: bool
    seed: int
    mode: str | None = None
    gap_ns: int = 0
    group: list[str] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)
    te: list[TeMatch] = field(default_factory=list)

    def __post_init__(self):
        # read back from plan.json, the matches are plain dicts
        self.te = [m if isinstance(m, TeMatch) else TeMatch(**m) for m in self.te]


def te_mark(fh: FlowHash, dscp: int, proto: int, dport: int, fragment: bool = False) -> tuple[int, int | None]:
    """(the mark the program gives a packet, the index of the te: rule that set it): the first
    rule that matches, else (0, None)."""
    ports = proto in (TCP, UDP) and not fragment
    for k, m in enumerate(fh.te):
        if (dscp in m.dscp) == m.negate:
            continue
        if m.dport and not (ports and dport == m.dport):
            continue
        return m.mark, k
    return 0, None


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
           fragment: bool = False, qp: int | None = None) -> list[int]:
    """The words hashed, in order, as the program reads them off the packet (numbers in network
    order); in ecmp-qp, a RoCEv2 packet's destination QP (24 bits) after them."""
    if not fh.l4:
        return [saddr, daddr]
    ports = (sport << 16 | dport) if proto in (TCP, UDP) and not fragment else 0
    out = [saddr, daddr, proto, ports]
    if fh.mode == "ecmp-qp" and proto == UDP and dport == ROCE_PORT and not fragment and qp is not None:
        out.append(qp & 0xFFFFFF)
    return out


def state(fh: FlowHash, saddr: int, daddr: int, proto: int, sport: int, dport: int,
          fragment: bool = False, qp: int | None = None) -> int:
    """The 64-bit state after the packet's words, before the finaliser."""
    h = initial(fh)
    for word in fields(fh, saddr, daddr, proto, sport, dport, fragment, qp):
        h = absorb(h, word)
    return h


def hash32(fh: FlowHash, saddr: int, daddr: int, proto: int, sport: int, dport: int,
           fragment: bool = False, qp: int | None = None) -> int:
    """The 32-bit flow hash the program gives this packet (`skb->hash`) in ecmp or ecmp-qp; in the
    other modes, the flow's own hash: the key its state is kept under."""
    return finalise(state(fh, saddr, daddr, proto, sport, dport, fragment, qp)) & M32


def flowlet_hash(fh: FlowHash, h: int, flowlet: int) -> int:
    """flowlet: the hash of a packet of the flow whose `state` is `h`, in its flowlet number `flowlet`."""
    return finalise(absorb(h, flowlet)) & M32


def spray_hash(key: int, count: int, weights: list[int] | None = None) -> int:
    """spray: the hash of the flow's packet number `count` (from 0), the flow's own hash being
    `key`, on a router whose uplinks have `weights` (none: no one set of uplinks)."""
    if weights:
        slots = spray_slots(weights)
        return slots[(key + count) % len(slots)]
    return (key + count * WEYL) & M32


def spray_slots(weights: list[int]) -> list[int]:
    """spray's round: each uplink's steering hash once per unit of its weight."""
    return [t for t, w in zip(steer_targets(weights), weights) for _ in range(w)]


def steer_targets(weights: list[int]) -> list[int]:
    """adaptive: per next hop, a hash that the kernel's hash-threshold choice sends to it (its
    bound: the highest half-hash it holds)."""
    return [max(0, bound) << 1 for bound in upper_bounds(weights, [True] * len(weights))]


def adaptive_pick(depths: list[int], last: int) -> int:
    """adaptive: the next hop with the fewest bytes queued; a tie goes to the first after the
    router's `last` pick, so the uplinks that tie take packets in turn (an uplink whose queue
    builds drops out of the turn, and the others share its part evenly)."""
    n = len(depths)
    start = (last + 1) % n
    best = start
    for i in range(1, n):
        j = (start + i) % n
        if depths[j] < depths[best]:
            best = j
    return best


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
