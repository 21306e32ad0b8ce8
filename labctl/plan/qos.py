"""Per-port queueing, as numbers: traffic classes, their HTB handles and shares, the ECN profile,
and the PFC headroom and XOFF of each lossless class (pure: no kernel).

Each egress port: HTB root 1: at the link rate; one HTB class 1:(0x10+tc) per traffic class,
guaranteed its weight's share of the link and allowed to borrow up to all of it; strict classes
borrow first (HTB prio 0); a byte-limited bfifo leaf (0x20+tc): per class. Packets are put in a
class through skb->priority = 1:(0x10+tc): by nftables on forwarding nodes (from DSCP), by
SO_PRIORITY in the traffic agents on hosts.
"""
from __future__ import annotations

from dataclasses import replace

from labctl.plan import model

ETH_HEADER = 14

HTB_ROOT = 0x10000      # 1:
HTB_LINK = 0x10001      # 1:1, the link rate


def class_minor(tc: int) -> int:
    return 0x10 + tc


def class_handle(tc: int) -> int:
    return 0x10000 | class_minor(tc)


def leaf_handle(tc: int) -> int:
    return (0x20 + tc) << 16


def priority_value(tc: int) -> int:
    """skb->priority (SO_PRIORITY) that HTB maps straight to class 1:(0x10+tc)."""
    return class_handle(tc)


# ESP in tunnel mode with AES-GCM (RFC 4303, RFC 4106; wan/esp.py) adds to each inner IPv4 packet:
# outer IPv4 20 + SPI/seq 8 + IV 8 + pad 0-3 (to a 4-byte boundary) + pad length 1 + next header 1
# + ICV 16 = 54 to 57 bytes. An encrypted port's shaper charges the most, so that its queue, not the
# line's, holds what the fibre cannot take yet.
ESP_MIN_OVERHEAD = 20 + 8 + 8 + 2 + 16
ESP_MAX_OVERHEAD = ESP_MIN_OVERHEAD + 3


def esp_padding(inner_len: int) -> int:
    """Pad bytes that bring inner packet + pad length + next header to a multiple of 4."""
    return (-(inner_len + 2)) % 4


def esp_overhead(inner_len: int) -> int:
    """Bytes ESP adds on the wire to an inner IPv4 packet of `inner_len` bytes."""
    return ESP_MIN_OVERHEAD + esp_padding(inner_len)


def lossless_tbf_rate(link_bps: int) -> int:
    """A lossless class's TBF leaf runs far above the link (HTB shapes) until a PFC pause sets it to 8 bit/s."""
    return 10 * link_bps


def lossless_tbf_burst(link_bps: int, frame: int) -> int:
    return max(64 * 1024, 4 * frame, link_bps // 8 // 1000)


MIN_CLASS_BPS = 8_000      # the least rate a port or class is shaped to


def class_rates(classes: list[dict], link_bps: int) -> list[int]:
    total = sum(c["weight"] for c in classes)
    return [max(MIN_CLASS_BPS, link_bps * c["weight"] // total) for c in classes]


def shaping_burst(rate_bps: int, quantum: int) -> int:
    """HTB's burst: about 1 ms of the rate (tc's default loses 25% at 1 Gbit/s), and two quanta."""
    return max(rate_bps // 8 // 1000, 2 * quantum)


def reshaped(shaping, rate_bps: int):
    """A port's Shaping at a new rate, as `tc set --rate` makes it: the link class at the rate, each
    class's guaranteed share kept in proportion (its ceil is the link). The shares are exact, not
    raised to MIN_CLASS_BPS (the kernel is given that much at least), so that a port slowed to a
    trickle and set back gets its classes' proportions back."""
    total = sum(c.rate_bps for c in shaping.classes) or 1
    return replace(shaping, rate_bps=rate_bps, burst_bytes=shaping_burst(rate_bps, shaping.quantum),
                   classes=[replace(c, rate_bps=max(1, rate_bps * c.rate_bps // total)) for c in shaping.classes])


def marking_probability(depth: int, kmin: int, kmax: int, pmax: float) -> float:
    """The ECN profile (RED-like on instantaneous depth): 0 below Kmin, linear to Pmax at Kmax, 1 above."""
    if depth < kmin:
        return 0.0
    if depth > kmax:
        return 1.0
    return pmax * (depth - kmin) / (kmax - kmin)


def ce_counter_name(ifindex: int, tc: int) -> str:
    """The named nft counter of the packets a port's class marked CE (written by the controller's
    marking rules, read by the sampler and `tc show`)."""
    return f"ce_{ifindex}_{tc}"


def add_marks(marks: dict[str, int], counted: dict[tuple[int, int], int]) -> dict[str, int]:
    """CE counts by counter name (nftables' own) with a tc program's {(ifindex, tc): count} added."""
    for (ifindex, tc), count in counted.items():
        name = ce_counter_name(ifindex, tc)
        marks[name] = marks.get(name, 0) + count
    return marks


def dscp_map(classes: list[dict]) -> dict[int, int]:
    """DSCP → traffic class for every DSCP a class names (the rest go to the default class)."""
    return {d: c["tc"] for c in classes for d in c["dscp"]}


# Lab time from a queue passing XOFF to its feeders stopped: the controller's worst-case reaction
# (telemetry/reaction.py), with a margin over the worst read seen (docs/design.md §8 and §10).
# Every lossless test checks that each run's worst stayed within this.
PFC_RESPONSE_S = 0.03

# The controller reads a switch whose queues are all empty every CONTROLLER_IDLE_S, unless reading
# every idle switch that often would take more than IDLE_CPU_SHARE of a core: a read costs about
# READ_BASE_S plus READ_PER_QUEUE_S per queue (one batched GET each; docs/design.md §8). At 1,024 GPUs (176 switches, 3,072 queues) 100 Hz each took the whole core, real-time,
# and starved the agents of a 64-rank all-reduce; idle switches are then read less often, and the
# headroom grows by what that adds to the reaction.
CONTROLLER_IDLE_S = 0.01
IDLE_CPU_SHARE = 0.25
READ_BASE_S, READ_PER_QUEUE_S = 20e-6, 10e-6


def controller_idle_s(queues_per_switch: list[int]) -> float:
    """Seconds between two reads of an idle switch, given each controlled switch's queue count."""
    round_s = sum(READ_BASE_S + READ_PER_QUEUE_S * q for q in queues_per_switch)
    return max(CONTROLLER_IDLE_S, round_s / IDLE_CPU_SHARE)


def pfc_response_s(queues_per_switch: list[int], measured_s: float | None = None,
                   on_arrivals: bool = False) -> float:
    """The reaction PFC headroom is sized for: the measured worst (this machine's, or the lab's
    `qos.pfc_response` where its controller is slower) plus any slower idle pace, unless the
    controller reads on arrivals (dataplane/arrivals.py), which leaves no switch unwatched."""
    base = PFC_RESPONSE_S if measured_s is None else measured_s
    return base if on_arrivals else base + controller_idle_s(queues_per_switch) - CONTROLLER_IDLE_S


def headroom(lab_rate_bps: int, feeders: int, lab_delay_ns: int, frame: int,
             response_s: float = PFC_RESPONSE_S) -> int:
    """Buffer above XOFF for what still arrives once the queue passes it, from every feeding port at
    once (the switch watches its egress queue, not per-ingress counters): a round trip of the link
    (the pause travelling out, the last data travelling in) plus the controller's reaction, plus two
    frames (one may leave a paused port, one may be on the wire)."""
    seconds = 2 * lab_delay_ns / 1e9 + response_s
    return int(max(1, feeders) * lab_rate_bps / 8 * seconds) + 2 * frame


def bdp_bytes(rate_bps: int, one_way_ns: int) -> int:
    """Bandwidth x round trip: the buffer a single window-limited flow needs to keep the link full
    (the same in the lab: rates / D and times x D)."""
    return int(rate_bps / 8 * 2 * one_way_ns / 1e9)


def ecn_thresholds(kmin: int, kmax: int, link_bps: int, reference_bps: int | None) -> tuple[int, int]:
    """A port's (Kmin, Kmax): the profile's, scaled by its link's real rate over the rate the profile
    is given for (DCQCN's deployments scale them so: a queue of Kmin drains in the same time at any
    rate). Without a reference rate, the same bytes at every rate."""
    if not reference_bps:
        return kmin, kmax
    return max(1, round(kmin * link_bps / reference_bps)), max(2, round(kmax * link_bps / reference_bps))


def bdp_distance_m(buffer_bytes: int, rate_bps: int, ns_per_km: int = 4900) -> float:
    """The fibre length at which the bandwidth-delay product equals `buffer_bytes`: the buffer holds
    one round trip of the link, half of it each way."""
    return buffer_bytes * 8 / rate_bps / 2 / (ns_per_km * 1e-9) * 1000


def shaping_for(lab_rate_bps: int, mtu: int, buffer_bytes: int, classes=(), lossless_fabric: bool = False,
                feeders: int = 1, lab_delay_ns: int = 0, pfc_quanta: int = 0xFFFF,
                class_buffer: int | None = None, credit_based: bool = False,
                response_s: float = PFC_RESPONSE_S) -> model.Shaping:
    """`class_buffer` gives every class that buffer (a WAN link's deep buffer) instead of its own.
    `credit_based` (NVLink): a lossless class's buffer grows to hold its whole headroom above XOFF,
    as a credit loop is sized to the link, where Ethernet PFC caps the headroom at half the buffer."""
    frame = mtu + ETH_HEADER
    burst = shaping_burst(lab_rate_bps, frame)
    specs = [c.model_dump() for c in classes]
    if class_buffer:
        for c in specs:
            c["buffer"] = class_buffer
    plans: list[model.ClassPlan] = []
    for c, rate in zip(specs, class_rates(specs, lab_rate_bps)):
        lossless = c["lossless"] and lossless_fabric
        room = c["headroom"] or headroom(lab_rate_bps, feeders, lab_delay_ns, frame, response_s)
        if lossless and credit_based:
            c["buffer"] = max(c["buffer"], c["buffer"] // 2 + room)
        xoff = max(2 * frame, c["buffer"] - min(room, c["buffer"] // 2)) if lossless else 0
        plans.append(model.ClassPlan(name=c["name"], tc=c["tc"], dscp=list(c["dscp"]), rate_bps=rate,
                                     prio=0 if c["strict"] else 1, buffer_bytes=c["buffer"], lossless=lossless,
                                     ecn=c["ecn"], xoff_bytes=xoff, xon_bytes=max(0, xoff - 2 * frame)
                                     if lossless else 0, pfc_quanta=pfc_quanta))
    return model.Shaping(rate_bps=lab_rate_bps, burst_bytes=burst, quantum=frame, buffer_bytes=buffer_bytes,
                         classes=plans)
