"""Per-port traffic classes and the classification rules (pure: no kernel).

Each egress port: HTB root 1: at the link rate; one HTB class 1:(0x10+tc) per traffic class,
guaranteed its weight's share of the link and allowed to borrow up to all of it; strict classes
borrow first (HTB prio 0); a byte-limited bfifo leaf (0x20+tc): per class. Packets are put in a
class through skb->priority = 1:(0x10+tc): by nftables on forwarding nodes (from DSCP), by
SO_PRIORITY in the traffic agents on hosts.
"""
from __future__ import annotations

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


def lossless_tbf_rate(link_bps: int) -> int:
    """A lossless class's TBF leaf runs far above the link (HTB shapes) until a PFC pause sets it to 8 bit/s."""
    return 10 * link_bps


def lossless_tbf_burst(link_bps: int, frame: int) -> int:
    return max(64 * 1024, 4 * frame, link_bps // 8 // 1000)


def class_rates(classes: list[dict], link_bps: int) -> list[int]:
    total = sum(c["weight"] for c in classes)
    return [max(8_000, link_bps * c["weight"] // total) for c in classes]


def dscp_map(classes: list[dict]) -> dict[int, int]:
    """DSCP → traffic class for every DSCP a class names (the rest go to the default class)."""
    return {d: c["tc"] for c in classes for d in c["dscp"]}


def default_tc(classes: list[dict]) -> int:
    return next(c["tc"] for c in classes if not c["dscp"])


def classify_ruleset(classes: list[dict]) -> str:
    """nftables for a forwarding node: DSCP → skb->priority (the HTB class) on forwarded packets."""
    rules = "\n".join(f"    ip dscp {d} meta priority set 1:{class_minor(tc):x}"
                      for d, tc in sorted(dscp_map(classes).items()))
    return ("table ip labctl {\n  chain classify {\n    type filter hook forward priority 0; policy accept;\n"
            f"{rules}\n  }}\n}}\n")
