"""User-space ESP (AES-GCM, tunnel mode) against scapy's independent implementation."""
from scapy.layers.inet import IP, UDP
from scapy.layers.ipsec import ESP, SecurityAssociation
from scapy.layers.l2 import Ether

from labctl.wan import esp


def inner_frame(tos: int = 26 << 2 | 2) -> bytes:
    return bytes(Ether(src="02:1a:00:01:00:00", dst="02:1a:00:02:00:00")
                 / IP(src="10.1.0.1", dst="10.1.1.9", tos=tos) / UDP(sport=49152, dport=4791) / (b"r" * 1000))


def test_scapy_decrypts_what_we_encrypt_and_we_decrypt_what_it_encrypts():
    sa = esp.Sa.new(0x1001, "10.9.0.0", "10.9.0.1")
    frame = inner_frame()
    wire = esp.encapsulate(sa, frame)
    outer = Ether(wire)[IP]
    assert outer.proto == 50 and outer.src == "10.9.0.0" and outer.tos == frame[15]
    theirs = SecurityAssociation(ESP, spi=sa.spi, crypt_algo="AES-GCM", crypt_key=sa.key + sa.salt,
                                 tunnel_header=IP(src=sa.src, dst=sa.dst))
    assert bytes(theirs.decrypt(outer)) == frame[14:]
    back = theirs.encrypt(IP(frame[14:]), seq_num=7)
    assert esp.decapsulate({sa.spi: sa}, frame[:14] + bytes(back)) == frame


def test_tampered_frames_and_unknown_spis_are_refused_and_ce_survives_the_tunnel():
    sa = esp.Sa.new(0x2002, "10.9.0.0", "10.9.0.1")
    frame = inner_frame()
    wire = bytearray(esp.encapsulate(sa, frame))
    assert esp.decapsulate({}, bytes(wire)) is None
    tampered = bytearray(wire)
    tampered[-20] ^= 1
    assert esp.decapsulate({sa.spi: sa}, bytes(tampered)) is None
    wire[15] |= 3                                  # a queue on the WAN marked the outer header CE
    inner = esp.decapsulate({sa.spi: sa}, bytes(wire))
    marked = IP(inner[14:])
    checksum = marked.chksum
    del marked.chksum
    assert marked.tos & 3 == 3 and IP(bytes(marked)).chksum == checksum      # header checksum redone
    assert esp.encapsulate(sa, bytes(Ether(type=0x0806) / (b"\x00" * 40))) is None   # not IPv4: not tunnelled


def test_wireshark_sa_line():
    sa = esp.Sa(0x1001, bytes(range(16)), b"\xaa\xbb\xcc\xdd", "10.9.0.0", "10.9.0.1")
    assert sa.wireshark_sa() == ('"IPv4","10.9.0.0","10.9.0.1","0x00001001","AES-GCM with 16 octet ICV [RFC4106]",'
                                 '"0x000102030405060708090a0b0c0d0e0faabbccdd","NULL",""')


def test_esp_adds_54_to_57_bytes_as_its_padding_says_and_scapy_agrees():
    """Outer IPv4 20 + SPI/seq 8 + IV 8 + pad 0-3 + pad length 1 + next header 1 + ICV 16."""
    sa = esp.Sa.new(0x3003, "10.9.0.0", "10.9.0.1")
    seen = set()
    for payload in range(1000, 1004):
        frame = bytes(Ether() / IP(src="10.1.0.1", dst="10.1.1.9") / UDP() / (b"r" * payload))
        inner = len(frame) - 14
        added = len(esp.encapsulate(sa, frame)) - len(frame)
        theirs = SecurityAssociation(ESP, spi=sa.spi, crypt_algo="AES-GCM", crypt_key=sa.key + sa.salt,
                                     tunnel_header=IP(src=sa.src, dst=sa.dst))
        assert added == esp.overhead(inner) == len(theirs.encrypt(IP(frame[14:]))) - inner
        seen.add(added)
    assert seen == {54, 55, 56, 57} and (esp.MIN_OVERHEAD, esp.MAX_OVERHEAD) == (54, 57)


def test_the_iv_never_repeats_past_32_bits_and_the_sa_refuses_to_reuse_one():
    """GCM under one key must never see a nonce twice: across the 32-bit sequence number's wrap
    the IV keeps counting (the header carries its low 32 bits), and at the 64-bit end the SA stops."""
    sa = esp.Sa.new(0x3003, "10.9.0.0", "10.9.0.1")
    frame = inner_frame()
    sa.seq = 2**32 - 2
    ivs, seqs = [], []
    for _ in range(4):
        wire = esp.encapsulate(sa, frame)
        seqs.append(int.from_bytes(wire[14 + 20 + 4:14 + 20 + 8], "big"))
        ivs.append(int.from_bytes(wire[14 + 20 + 8:14 + 20 + 16], "big"))
        assert esp.decapsulate({sa.spi: sa}, wire) == frame
    assert ivs == [2**32 - 1, 2**32, 2**32 + 1, 2**32 + 2] and len(set(ivs)) == 4
    assert seqs == [2**32 - 1, 0, 1, 2]
    sa.seq = esp.MAX_PACKETS
    try:
        esp.encapsulate(sa, frame)
        raise AssertionError("sealed past the last IV")
    except OverflowError:
        pass
