"""Each port's egress buffers, and the checks that every queue can hold a frame and reach its
thresholds (pure: numbers from the plan, errors located at the lab file's keys).

A class's buffer on a port comes from one key of the lab file: the link's `buffer:`, else on a
delayed link (a WAN line) the larger of the bandwidth-delay product and `defaults.buffer`, else the
class's own `qos.classes[k].buffer`. The ECN profile (`qos.ecn`) is lab-wide. A Kmin that a
lab-wide buffer cannot reach is an error: that class marks on no port of that buffer. Against one
link's own buffer it is a located note, since the profile also serves every other port and the
link may be meant shallow (a shallow-buffer run of TCP, which is not ECN-capable here). A Kmax
above a buffer is a note too: the queue still marks from Kmin, only never up to Pmax, and
`qos.ecn.rate` legitimately scales a fast port's Kmax past the default buffer (6.4 MB at 400G for
a 1.6 MB profile given at 100G).
"""
from __future__ import annotations

from labctl.errors import InputError
from labctl.plan import qos
from labctl.topology.yamlpos import dotted
from labctl.units import format_size


def format_buffer(nbytes: int) -> str:
    """A buffer as lab files write it: 300KB for 300,000 bytes, 4MiB for the default."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes % 1000 and nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return format_size(nbytes)


def link_buffer(t, lk, link) -> int | None:
    """The buffer every class of both ports of a link gets, or None where each class keeps its own:
    its `buffer:`, else on a delayed link the larger of the BDP and the lab's default buffer.

    The larger, not the BDP alone: a DCI router is a deep-buffer router, and its WAN port never
    holds less than the lab's default per-port buffer, which every fabric port has. Below about
    8.6 km at 400G the BDP is less than 4 MiB (490 kB at 1 km), and a WAN queue shallower than the
    leaves' would make a short WAN drop the bursts the fabric absorbs, so that a sweep of distance
    (wan-distance, tests/test_netns_wan.py at 1, 10 and 25 km) measured drops instead of delay. A
    link that wants exactly the BDP, or less, says so with `buffer:`."""
    if lk.buffer:
        return lk.buffer
    if link.latency_ns:
        return max(t.defaults.buffer, qos.bdp_bytes(link.rate_bps, link.latency_ns))
    return None


def _source(t, link, class_index: int) -> tuple:
    """The key of the lab file that sized this class's buffer on this link's ports."""
    if t.links[link.id].buffer:
        return ("links", link.id, "buffer")
    if link.latency_ns:
        return ("defaults", "buffer")
    return ("qos", "classes", class_index, "buffer")


def check(b) -> list[str]:
    """Refuse a queue that cannot hold one frame of its link's MTU, and an ECN Kmin that a lab-wide
    buffer cannot reach; return a located note for each key whose buffer is below a threshold."""
    t, smap = b.topo, b.smap
    index = {c.tc: k for k, c in enumerate(t.qos.classes)}
    short: dict[tuple, list] = {}          # (key, 'kmin' or 'kmax') -> [first port, its class, ports]
    for node in b.nodes.values():
        for iface in node.interfaces:
            frame = iface.mtu + qos.ETH_HEADER
            for c in iface.shaping.classes:
                key = _source(t, b.links[iface.link], index[c.tc])
                port = f"{node.name}:{iface.name}"
                if c.buffer_bytes < frame:
                    raise InputError(smap.where(key), f"a buffer of {c.buffer_bytes} B holds less than one frame "
                                     f"of {frame} B (MTU {iface.mtu} + the {qos.ETH_HEADER}-byte Ethernet header): "
                                     f"class {c.name}'s queue on {port} would drop every full-size packet",
                                     f"give at least {frame} B (one frame); a port usually holds hundreds of "
                                     "frames (the default is 4MiB)")
                over = _over(c) if c.ecn and node.switching else ""
                if over == "kmin" and key[0] != "links":
                    raise _profile_error(smap, key, port, c)
                if over:
                    short.setdefault((key, over), [port, c, 0])[2] += 1
    notes = [_note(smap, key, over, *seen) for (key, over), seen in short.items()]
    if "buffer" in t.defaults.model_fields_set:
        frame = t.defaults.mtu + qos.ETH_HEADER
        if t.defaults.buffer < frame:       # what a delayed link would get, used or not
            raise InputError(smap.where(("defaults", "buffer")), f"a buffer of {t.defaults.buffer} B holds less "
                             f"than one frame of {frame} B (MTU {t.defaults.mtu} + the {qos.ETH_HEADER}-byte "
                             "Ethernet header)", f"give at least {frame} B; the default is 4MiB")
        if not any(lk.latency_ns for lk in b.links):
            notes.append(f"{smap.where(('defaults', 'buffer'))}: it sizes only the ports of links "
                         "with latency (a WAN); this lab has none, so it changes nothing. A fabric port's buffer "
                         "is each class's: qos.classes[k].buffer, or a link's buffer:")
    return notes


def _over(c) -> str:
    """What the queue's buffer cannot reach: 'kmin' (it never marks), 'kmax' (it never reaches
    Pmax: tc-red(8) asks the same, a limit above max), or ''."""
    if c.kmin_bytes >= c.buffer_bytes:
        return "kmin"
    if c.kmax_bytes > c.buffer_bytes:
        return "kmax"
    return ""


def _consequence(c, over: str) -> str:
    if over == "kmin":
        return (f"the ECN profile's Kmin of {format_buffer(c.kmin_bytes)} is at or above the "
                f"{format_buffer(c.buffer_bytes)} buffer of class {c.name}, so the queue never marks CE")
    return (f"the ECN profile's Kmax of {format_buffer(c.kmax_bytes)} is above the {format_buffer(c.buffer_bytes)} "
            f"buffer of class {c.name}, so the queue fills before marking reaches Pmax")


def _profile_error(smap, key, port, c) -> InputError:
    threshold = ("qos", "ecn", "kmin")
    # the key the file writes is the one to change; both are lab-wide
    at = threshold if threshold in smap.lines or key not in smap.lines else key
    scaled = " (scaled to the port's rate by qos.ecn.rate)" if ("qos", "ecn", "rate") in smap.lines else ""
    return InputError(smap.where(at), f"on {port}, {_consequence(c, 'kmin')}{scaled}",
                      f"give qos.ecn.kmin below the queue's buffer ({format_buffer(c.buffer_bytes)}), or a "
                      f"larger buffer at {dotted(key)}")


def _note(smap, key, over, port, c, ports) -> str:
    threshold = ("qos", "ecn", over)
    at = threshold if key[0] != "links" and threshold in smap.lines else key
    more = f" and {ports - 1} more port(s)" if ports > 1 else ""
    value = c.kmin_bytes if over == "kmin" else c.kmax_bytes
    return (f"{smap.where(at)}: on {port}{more}, {_consequence(c, over)} (the profile, qos.ecn, is lab-wide). "
            f"fix: a buffer {'above' if over == 'kmin' else 'of at least'} {format_buffer(value)} at {dotted(key)}, "
            f"or qos.ecn.{over} {'below' if over == 'kmin' else 'at most'} {format_buffer(c.buffer_bytes)} (every "
            f"port's), or `labctl tc set {port} --kmin ... --kmax ...` once the lab is up")
