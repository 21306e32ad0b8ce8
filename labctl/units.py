"""Parsing of rates, durations and sizes as people write them ("400G", "5ms", "512KiB")."""
from __future__ import annotations

import math
import re

_NUM = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"

_RATE_UNITS = {
    "": 1, "bps": 1, "bit": 1, "b/s": 1,
    "k": 1e3, "kbps": 1e3, "kbit": 1e3, "kb/s": 1e3,
    "m": 1e6, "mbps": 1e6, "mbit": 1e6, "mb/s": 1e6,
    "g": 1e9, "gbps": 1e9, "gbit": 1e9, "gb/s": 1e9,
    "t": 1e12, "tbps": 1e12, "tbit": 1e12, "tb/s": 1e12,
    # as labctl prints them (format_rate): what it writes, it reads back
    "bit/s": 1, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "tbit/s": 1e12,
}
_TIME_UNITS = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1e3, "mb": 1e6, "gb": 1e9,
    "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3,
}


# Past these nothing in a lab means anything, and int() of an infinite float is a crash, not an error.
RATE_MAX = 1e15             # 1 Pbit/s
SIZE_MAX = 1 << 48          # 256 TiB
DURATION_MAX_NS = 86400e9   # a day


def _bounded(value: float, limit: float, text, what: str) -> float:
    if not math.isfinite(value) or value < 0 or value > limit:
        raise ValueError(f"{text!r} is not a usable {what} (it must be finite, from 0 up to {limit:g} "
                         f"{'bit/s' if what == 'rate' else 'bytes' if what == 'size' else 'ns'})")
    return value


def _as_float(value) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _split(text: str, what: str, examples: str) -> tuple[float, str]:
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a {what}; write it like {examples}")
    m = re.fullmatch(_NUM + r"(?P<unit>[A-Za-zµ/]*)", text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a {what}; write it like {examples}")
    return float(m.group("num")), m.group("unit")


def parse_rate(value: str | int | float) -> int:
    """A link rate in bit/s. Bare numbers are bit/s; "400G" is 400 Gbit/s (network units, powers of 10)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a rate; write it like 400G, 100Gbit or 25Mbps")
    if isinstance(value, (int, float)):
        num, unit = _as_float(value), ""
    else:
        num, unit = _split(value, "rate", "400G, 100Gbit or 25Mbps")
        unit = unit.lower()
    if unit not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {unit!r} in {value!r}; use one of G, Gbit, Gbps, Gbit/s, M, Mbit, "
                         "Mbps, Mb/s, K")
    return int(round(_bounded(num * _RATE_UNITS[unit], RATE_MAX, value, "rate")))


def parse_duration_ns(value: str | int | float) -> int:
    """A duration in nanoseconds. Bare numbers are seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write it like 5us, 2ms or 0.5s")
    if isinstance(value, (int, float)):
        return int(round(_bounded(_as_float(value) * 1e9, DURATION_MAX_NS, value, "duration")))
    num, unit = _split(value, "duration", "5us, 2ms or 0.5s")
    unit = unit.lower()
    if unit == "":
        unit = "s"
    if unit not in _TIME_UNITS:
        raise ValueError(f"unknown time unit {unit!r} in {value!r}; use ns, us, ms or s")
    return int(round(_bounded(num * _TIME_UNITS[unit], DURATION_MAX_NS, value, "duration")))


def parse_size(value: str | int | float) -> int:
    """A size in bytes. KB/MB are powers of 10 (switch datasheets), KiB/MiB and K/M powers of 2."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; write it like 512KiB, 1MB or 9000")
    if isinstance(value, (int, float)):
        return int(_bounded(_as_float(value), SIZE_MAX, value, "size"))
    num, unit = _split(value, "size", "512KiB, 1MB or 9000")
    if re.fullmatch(r"[kKmMgGtT]b", unit):
        raise ValueError(f"{value!r} is in bits ({unit[0]}b: a lower-case b is a bit); a size is bytes: write "
                         f"{num:g}{unit[0].upper()}B, or {num:g}{unit[0].upper()}iB for powers of 2")
    unit = unit.lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {value!r}; use B, KB, MB, KiB or MiB")
    return int(round(_bounded(num * _SIZE_UNITS[unit], SIZE_MAX, value, "size")))


def format_rate(bps: float) -> str:
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def format_size(nbytes: float) -> str:
    """Bytes as written in lab files (400KB, 1.5MB, 900B): decimal units, as parse_size reads them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}B"
