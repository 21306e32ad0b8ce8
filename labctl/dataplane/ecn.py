"""RED-like ECN marking on (near-)instantaneous queue depth (docs/design.md §3), as nftables rules.

p = 0 below Kmin, rising linearly to Pmax at Kmax, 1 above; only ECT packets are marked CE, and
nothing is dropped for being non-ECT. The probability is applied as `numgen random mod 65536 < N`
in a per-(port, class) chain that the controller rewrites when N changes.
"""
from __future__ import annotations

from labctl.plan.qos import ce_counter_name as counter_name

SCALE = 65536


def threshold(p: float, steps: int = 1024) -> int:
    """N for `numgen random mod 65536 < N`, quantised to `steps` levels so the rules change rarely."""
    return round(p * steps) * SCALE // steps


RAMP_STEPS = 16


def level(depth: int, kmin: int, kmax: int, pmax: float, current: int = 0, steps: int = RAMP_STEPS) -> int:
    """N for a queue `depth` bytes deep that marks with N now: the profile (qos.marking_probability)
    with its ramp from Kmin to Kmax cut into `steps` levels, and a queue must move a quarter step
    past a level's edge to leave it. Each change is an nftables transaction; with 1/1024 levels and
    no dead band a queue hovering on the ramp changed the rules on nearly every read, and the
    real-time controller spent a third of its time rewriting them instead of leaving the CPU to
    the agents."""
    if depth < kmin:
        return 0
    if depth > kmax:
        return SCALE
    pos = steps * (depth - kmin) / max(1, kmax - kmin)
    if current < SCALE and abs(pos - round(current / SCALE * steps / pmax)) < 0.75:
        return current
    return threshold(pmax * round(pos) / steps)


def chain_name(ifindex: int, tc: int) -> str:
    return f"ecn_{ifindex}_{tc}"


def chain_rules(ifindex: int, tc: int, n: int, family: str = "ip") -> str:
    """The nftables commands that set a port's class to mark with probability n/65536 (family ip on a
    router, bridge on an L2 switch: where kernel/nft.py put the classify chain)."""
    chain = chain_name(ifindex, tc)
    count = f'counter name "{counter_name(ifindex, tc)}"'
    cmds = [f"flush chain {family} labctl {chain}"]
    if n >= SCALE:
        cmds.append(f"add rule {family} labctl {chain} ip ecn {{ ect0, ect1 }} ip ecn set ce {count}")
    elif n > 0:
        cmds.append(f"add rule {family} labctl {chain} ip ecn {{ ect0, ect1 }} numgen random mod {SCALE} < {n} "
                    f"ip ecn set ce {count}")
    return "\n".join(cmds) + "\n"


def setup_rules(ports: list[tuple[int, int, int]], family: str = "ip") -> str:
    """Chains for (ifindex, tc, class minor) triples, jumped to from the classify chain by oif and class."""
    cmds = []
    for ifindex, tc, minor in ports:
        chain = chain_name(ifindex, tc)
        cmds.append(f"add counter {family} labctl {counter_name(ifindex, tc)}")
        cmds.append(f"add chain {family} labctl {chain}")
        cmds.append(f"add rule {family} labctl classify oif {ifindex} meta priority 1:{minor:x} jump {chain}")
    return "\n".join(cmds) + "\n"


def warm_up_rules(ifindex: int, tc: int, family: str = "ip") -> str:
    """One transaction that adds a marking rule with every expression the controller's rules use, and
    flushes it again: the chain ends as it was, and the kernel has what those rules need.

    On a stock kernel `numgen` and the named counter's `objref` are modules, which nftables loads
    when a rule first needs them (it aborts the transaction, runs modprobe and replays it). Left to
    the first marking, that load ran inside the controller's real-time loop: in a QEMU guest without
    KVM the controller then read nothing for 2.4 s, and a lossless incast overflowed two queues with
    no pause sent. Loaded before the controller says ready, it costs `up` that time once."""
    return chain_rules(ifindex, tc, 1, family) + f"flush chain {family} labctl {chain_name(ifindex, tc)}\n"
