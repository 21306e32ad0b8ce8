"""PFC frames against scapy's dissector and the pause arithmetic (pure)."""
import pytest
from scapy.all import Ether
from scapy.contrib.mac_control import MACControlClassBasedFlowControl

from labctl.dataplane import pfc


def test_frame_is_802_1qbb_and_parses_back():
    f = pfc.frame("02:1a:00:00:00:01", 3, 0xFFFF)
    p = Ether(f)
    assert p.dst == pfc.PFC_DST and p.type == 0x8808
    m = p[MACControlClassBasedFlowControl]
    assert m.c3_enabled == 1 and m.c3_pause_time == 0xFFFF and m.c0_enabled == 0
    assert pfc.parse(f) == {3: 0xFFFF}
    assert pfc.parse(pfc.frame("02:1a:00:00:00:01", 3, 0)) == {3: 0}


def test_other_frames_are_not_pfc():
    assert pfc.parse(bytes(60)) is None
    assert pfc.parse(b"\x01\x80\xc2\x00\x00\x01" + bytes(6) + b"\x88\x08\x00\x01" + bytes(44)) is None  # PAUSE


def test_pause_time_in_quanta_of_512_bit_times():
    assert pfc.pause_seconds(0xFFFF, 100_000_000) == pytest.approx(0.3355, rel=1e-3)
    assert pfc.pause_seconds(1, 400e9) == pytest.approx(1.28e-9)
