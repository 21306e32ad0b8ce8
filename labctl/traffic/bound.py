"""The bound an operation's time is measured against (`ideal_s`, `bound` in results.json).

Three things keep an operation from finishing sooner, and the bound is the largest of them:

- **the ports' bytes** (α-β, as NCCL's model counts them): per phase, the busiest NIC's payload
  bytes over its payload rate (NVLink and Ethernet hops each at their own speed), plus α per
  step, phases one after another;
- **a port's bytes and the waits it cannot hide**: a port cannot send before its first transfer's
  data has reached it (the chain of transfers before it, each at its sender's rate plus its path's
  propagation delay), and after its last transfer the data still travels and the transfers that
  wait for it still run. So, for every port, the shortest wait before it + its bytes + the
  shortest wait after it. Across a WAN this is what a sliced ring pays: its slices overlap the
  distance with sending, except at each end of the busiest port's work;
- **the longest chain of transfers that wait for one another**, each at its sender's rate plus
  its path's delay: a pipelined broadcast of one slice is its chain, whatever its busiest port.

The second and third are floors for any schedule the agents play (a transfer starts once all it
waits for has arrived). The first is too where each phase waits for the one before or shares its
busiest port, as labctl's collectives do; a schedule whose phases ran side by side on different
ports could beat it. Two margins are not modelled: HTB lets an idle port's first burst (a
millisecond of its rate) out faster than the rate, and the transfers of a `victim:` (which the
collective's time leaves out) are left out here too.

The parts: `bandwidth_s` and `alpha_s` (the first term); `serial_s`, what the waits add to it with
no distance at all (a chain of transfers in series, a port waiting for its first data or followed
by a pipeline's drain); `propagation_s`, what the paths' delays add on top of that.

Dependencies are walked in topological order: a training step (traffic/train.py) makes its
pipeline transfers first and gives them `after` entries that point at transfers made later.
"""
from __future__ import annotations

from collections import defaultdict

from labctl.plan.model import Interface, LabPlan, Node
from labctl.traffic import roce
from labctl.traffic.schedule import Schedule, Transfer


def payload_rate(plan: LabPlan, iface: Interface) -> float:
    """Bytes/s of RDMA payload a port carries at its lab rate (headers take the rest)."""
    mtu = roce.roce_mtu(iface.mtu)
    return iface.shaping.rate_bps / 8 * mtu / (mtu + roce.FRAME_OVERHEAD)


def topological(transfers: list[Transfer]) -> list[Transfer]:
    """The transfers ordered so that each comes after every transfer it waits for."""
    by_id = {t.id: t for t in transfers}
    waiting = {t.id: sum(1 for d in t.after if d in by_id) for t in transfers}
    then: dict[int, list[int]] = defaultdict(list)
    for t in transfers:
        for d in t.after:
            if d in by_id:
                then[d].append(t.id)
    ready = sorted(i for i, n in waiting.items() if n == 0)
    out = []
    while ready:
        i = ready.pop()
        out.append(by_id[i])
        for j in then[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)
    if len(out) != len(transfers):
        raise ValueError("a schedule's transfers wait for one another in a circle")
    return out


def longest_chain(schedule: Schedule, seconds) -> float:
    """The longest chain of transfers that wait for one another, each taking seconds(transfer)."""
    done: dict[int, float] = {}
    for t in topological(schedule.transfers):
        done[t.id] = max((done.get(d, 0.0) for d in t.after), default=0.0) + seconds(t)
    return max(done.values(), default=0.0)


def _costs(plan: LabPlan, schedule: Schedule, nodes: dict[int, Node]) -> dict:
    """Per (src, dst) pair: (the sender's port key, its payload rate, the receiver's port key, its
    payload rate, the path's propagation delay)."""
    from labctl.traffic.fabricmap import for_plan
    from labctl.traffic.pool import path_ports
    fmap = for_plan(plan)
    out = {}
    for a, b in {(t.src, t.dst) for t in schedule.transfers}:
        ia, ib = path_ports(plan, nodes[a], nodes[b])
        out[(a, b)] = ((nodes[a].name, ia.name, "tx"), payload_rate(plan, ia),
                       (nodes[b].name, ib.name, "rx"), payload_rate(plan, ib), fmap.delay_s(nodes[a], nodes[b]))
    return out


def chain_seconds(plan: LabPlan, schedule: Schedule, nodes: dict[int, Node]) -> float:
    """The longest chain of transfers that wait for one another, each taking its bytes at its
    sender's port rate and its path's delay: how long the last rank of a pipelined broadcast waits
    for its first byte (the α-β bound counts the busiest port, not the fill of a chain)."""
    cost = _costs(plan, schedule, nodes)
    return longest_chain(schedule, lambda t: t.nbytes / cost[(t.src, t.dst)][1] + cost[(t.src, t.dst)][4])


def bound_parts(plan: LabPlan, schedule: Schedule, nodes: dict[int, Node], alpha_s: float = 0.0) -> dict:
    """The bound with its parts: bandwidth_s, alpha_s, propagation_s, serial_s, total_s (lab seconds)."""
    # a victim runs beside the collective and is timed apart from it
    schedule = Schedule(schedule.collective, schedule.ranks, schedule.size,
                        [t for t in schedule.transfers if t.phase != "victim"], schedule.algorithm)
    cost = _costs(plan, schedule, nodes)
    parts = {"bandwidth_s": 0.0, "alpha_s": 0.0, "propagation_s": 0.0, "serial_s": 0.0}
    phases: dict[str, list] = {}
    for t in schedule.transfers:
        phases.setdefault(t.phase, []).append(t)
    for ts in phases.values():
        load: dict[tuple[str, str, str], float] = defaultdict(float)
        rate: dict[tuple[str, str, str], float] = {}
        for t in ts:
            for key, rate_of in _ports(cost[(t.src, t.dst)]):
                load[key] += t.nbytes
                rate[key] = rate_of
        parts["bandwidth_s"] += max(load[k] / rate[k] for k in load)
        parts["alpha_s"] += alpha_s * len({t.step for t in ts})
    base = parts["bandwidth_s"] + parts["alpha_s"]
    if not schedule.transfers:
        parts["total_s"] = base
        return parts
    send = {t.id: t.nbytes / cost[(t.src, t.dst)][1] for t in schedule.transfers}
    delay = {t.id: cost[(t.src, t.dst)][4] for t in schedule.transfers}
    # what the waits add, told apart: transfers in series with no distance at all (serial_s), then
    # what the paths' delays add to that (propagation_s); the dependency order serves both
    order = topological(schedule.transfers)
    then: dict[int, list[int]] = defaultdict(list)
    for t in schedule.transfers:
        for d in t.after:
            then[d].append(t.id)
    no_distance = max(base, _waits(schedule, order, then, cost, send, dict.fromkeys(delay, 0.0)))
    full = max(no_distance, _waits(schedule, order, then, cost, send, delay)) if any(delay.values()) \
        else no_distance
    parts["serial_s"] = no_distance - base
    parts["propagation_s"] = full - no_distance
    parts["total_s"] = full
    return parts


def _waits(schedule: Schedule, order: list[Transfer], then: dict[int, list[int]], cost: dict,
           send: dict[int, float], delay: dict[int, float]) -> float:
    """The larger of the longest chain of dependent transfers and, over every port, the shortest
    wait before its first transfer + its bytes + the shortest wait after its last (the module's
    docstring), each transfer taking `send` at its sender's rate and `delay` on its path; `order`
    is the transfers in dependency order, `then` each transfer's dependents."""
    head: dict[int, float] = {}                 # the earliest a transfer can start
    for t in order:
        head[t.id] = max((head[d] + send[d] + delay[d] for d in t.after if d in head), default=0.0)
    after_end: dict[int, float] = {}            # the least time from the end of its sending to the end
    for t in reversed(order):
        after_end[t.id] = delay[t.id] + max((send[s] + after_end[s] for s in then[t.id]), default=0.0)
    chain = max(head[t.id] + send[t.id] + after_end[t.id] for t in schedule.transfers)
    first: dict = {}
    last: dict = {}
    load: dict = defaultdict(float)
    rate: dict = {}
    for t in schedule.transfers:
        # a receiving port's waits are counted from arrivals
        leads = (head[t.id], head[t.id] + delay[t.id])
        trails = (after_end[t.id], after_end[t.id] - delay[t.id])
        for (key, rate_of), lead, trail in zip(_ports(cost[(t.src, t.dst)]), leads, trails):
            load[key] += t.nbytes
            rate[key] = rate_of
            first[key] = min(first.get(key, lead), lead)
            last[key] = min(last.get(key, trail), trail)
    widest = max(first[k] + load[k] / rate[k] + last[k] for k in load)
    return max(chain, widest)


def _ports(cost: tuple) -> list[tuple[tuple[str, str, str], float]]:
    """The two ports a transfer loads, the sender's then the receiver's, each with its payload rate."""
    tx, tx_rate, rx, rx_rate, _ = cost
    return [(tx, tx_rate), (rx, rx_rate)]


def ideal_seconds(plan: LabPlan, schedule: Schedule, nodes: dict[int, Node], alpha_s: float = 0.0) -> float:
    """The bound alone (bound_parts' total_s)."""
    return bound_parts(plan, schedule, nodes, alpha_s)["total_s"]
