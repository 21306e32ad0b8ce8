"""The RoCEv2 header templates, crafted by scapy: every BTH an agent sends, AETH per syndrome,
the CNP's reserved body.

The controller crafts them once per run and hands the table to its agents (`roce.install`), so an
agent never imports scapy: that import is 0.17 s of CPU per process, a second of a two-core
machine for the eight agents of every run. A process given no table crafts what it uses here, on
first use.
"""
from __future__ import annotations

import itertools
import logging
from functools import lru_cache

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)  # before scapy loads: no banner or warnings
from scapy.compat import raw  # noqa: E402  (scapy.all costs a second)
from scapy.contrib.roce import AETH, BTH, CNPPadding  # noqa: E402

BTH_LEN = 12
SYNDROMES = (0x00, 0x60)   # ACK; NAK, PSN sequence error: what the receivers send


def bth(opcode: int, padcnt: int, ackreq: bool, becn: bool) -> bytes:
    """The 12 BTH bytes for an opcode, with QP and PSN 0 (scapy's trailing ICRC placeholder
    dropped: it warns that it has no UDP layer to compute it over, which is why it is dropped)."""
    logging.getLogger("scapy").setLevel(logging.ERROR)
    return raw(BTH(opcode=opcode, padcount=padcnt, ackreq=int(ackreq), becn=int(becn), pkey=0xFFFF,
                   dqpn=0, psn=0))[:BTH_LEN]


def aeth(syndrome: int) -> bytes:
    """AETH with MSN 0: the sender patches its 24-bit MSN into the last three bytes."""
    return raw(AETH(syndrome=syndrome, msn=0))


def cnp_body() -> bytes:
    return raw(CNPPadding())   # 16 reserved zero bytes


@lru_cache(maxsize=4)
def table(opcodes: tuple[int, ...]) -> dict[str, str]:
    """Every template for these opcodes (each padding count, with and without ACK request and BECN),
    AETH for each syndrome the receivers send, and the CNP body: hex, keyed as `roce` looks them up."""
    out = {f"bth:{op}:{pad}:{int(ack)}:{int(becn)}": bth(op, pad, ack, becn).hex()
           for op, pad, ack, becn in itertools.product(opcodes, range(4), (False, True), (False, True))}
    out.update({f"aeth:{s}": aeth(s).hex() for s in SYNDROMES})
    out["cnp"] = cnp_body().hex()
    return out
