"""What each namespace's kernel is told: forwarding, reverse-path filtering, the ECMP hash, IPv6 off."""
from __future__ import annotations

# The 5-tuple a switch hashes: source and destination address, protocol, source and destination port.
HASH_FIELDS_5_TUPLE = 0x01 | 0x02 | 0x04 | 0x10 | 0x20


def multipath_hash_sysctls(policy: int, seed: int) -> dict[str, str]:
    """ECMP as a switch does it. L4 is the kernel's custom policy (3) over the 5-tuple, not policy 1:
    policy 1 reuses a locally sent TCP packet's socket hash, which is random per connection and
    survives the veth into the leaf, so the same TCP 5-tuple took a different spine on every
    connection. On kernels older than 5.12 (no policy 3) the backend falls back to policy 1."""
    out = {"net.ipv4.fib_multipath_hash_policy": "3" if policy == 1 else "0"}
    if policy == 1:
        out["net.ipv4.fib_multipath_hash_fields"] = str(HASH_FIELDS_5_TUPLE)
    out["net.ipv4.fib_multipath_hash_seed"] = str(seed)
    return out


def node_sysctls(hash_policy: int, hash_seed: int, forwarding: bool, bridged: bool = False) -> dict[str, str]:
    out = {
        # IPv6 off: no router solicitations, DAD or MLD reports in the captures of an IPv4 fabric
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
        "net.ipv4.ip_forward": "1" if forwarding else "0",
        # ECMP paths are asymmetric on purpose: reverse-path filtering would drop replies
        "net.ipv4.conf.all.rp_filter": "0",
        "net.ipv4.conf.default.rp_filter": "0",
        **multipath_hash_sysctls(hash_policy, hash_seed),
        "net.ipv4.conf.all.send_redirects": "0",
        "net.ipv4.conf.all.accept_redirects": "0",
        # a port that is down takes its ECMP next-hops with it (as a switch's routing would)
        "net.ipv4.conf.all.ignore_routes_with_linkdown": "1",
        "net.ipv4.conf.default.ignore_routes_with_linkdown": "1",
        # traceroute and ping across many hops must not be rate limited
        "net.ipv4.icmp_ratelimit": "0",
    }
    if bridged:
        # a bridge hands frames on at L2: no IP firewall pass (Docker's FORWARD DROP would drop them)
        out["net.bridge.bridge-nf-call-iptables"] = "0"
        out["net.bridge.bridge-nf-call-arptables"] = "0"
    return out
