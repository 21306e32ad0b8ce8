"""The ECMP hash model: which next hop a RoCE flow takes at each switch.

The lab hashes as Linux does with `fib_multipath_hash_policy` on L4: the 5-tuple (source and
destination address, UDP 4791, the source port Linux derives from the QP pair) into a 31-bit
value, and the next hop whose hash-threshold range holds it (fib_select_multipath: n equal
ranges); before 6.11 labctl's own seeded hash (plan/flowhash.py) gives the value instead. The
model keeps all of that except the keyed hash itself, which is replaced by
a 64-bit mixer with the same property the estimate relies on: for distinct 5-tuples the values
are independent and uniform. tests/test_netns_estimate.py checks that assumption against the
kernel's own choices in a real lab.

Vectorised with numpy: a 100,000-GPU ring is 100,000 flows per draw.
"""
from __future__ import annotations

import numpy as np

ROCE_PORT = 4791
UDP = 17
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def qpn(rank, peer, k):
    """The QP number the lab's agents use (traffic.sender.qpn), for arrays of ranks."""
    rank, peer, k = (np.asarray(x, dtype=np.uint64) for x in (rank, peer, k))
    return np.uint64(0x100000) | (rank & np.uint64(0xFF)) << np.uint64(12) | (peer & np.uint64(0x1FF)) << np.uint64(3) \
        | (k & np.uint64(7))


def udp_sport(local_qpn, remote_qpn):
    """rdma_get_udp_sport (traffic.roce.udp_sport) for arrays of QP numbers."""
    fl = np.asarray(local_qpn, dtype=np.uint64) * np.asarray(remote_qpn, dtype=np.uint64)
    fl ^= fl >> np.uint64(20)
    fl ^= fl >> np.uint64(40)
    fl &= np.uint64(0xFFFFF)
    return ((fl & np.uint64(0x3FFF)) ^ ((fl & np.uint64(0xFC000)) >> np.uint64(14))) | np.uint64(0xC000)


def _mix(x):
    """splitmix64's finaliser: every input bit reaches every output bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def flow_hash(saddr, daddr, sport, seed: int, salt=0):
    """A 31-bit hash of the flow's 5-tuple under `seed`. `salt` is the switch: 0 everywhere models
    one seed on every switch (as the lab sets it, so hashes polarise across tiers); a switch id
    models a seed per switch, as fabrics are usually configured."""
    with np.errstate(over="ignore"):
        h = _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) ^ np.asarray(salt, dtype=np.uint64))
        for field in (saddr, daddr, sport, ROCE_PORT, UDP):
            h = _mix(h ^ np.asarray(field, dtype=np.uint64))
    return h >> np.uint64(33)


def select(h, n):
    """Hash-threshold selection among n equal next hops: the index whose range [i, i+1) × 2^31/n
    holds h."""
    return ((np.asarray(h, dtype=np.uint64) * np.asarray(n, dtype=np.uint64)) >> np.uint64(31)).astype(np.int64)
