"""labctl's ECMP hash without root: the kernel's hash-threshold arithmetic, the hash's spread and
seed dependence, the engine choice, and the program's shape (tests/test_netns_flowhash.py runs it)."""
from __future__ import annotations

import random
import struct

import pytest

from labctl.kernel import flowhash as kernel_side
from labctl.errors import LabError
from labctl.plan.flowhash import FlowHash, hash32, select, select_in_group, upper_bounds

L4 = FlowHash(l4=True, seed=1)


def test_bounds_are_the_kernels_rounded_shares_of_two_to_the_31():
    # fib_rebalance: DIV_ROUND_CLOSEST_ULL(w << 31, total) - 1, cumulative over live next hops
    assert upper_bounds([1, 1], [True, True]) == [2 ** 30 - 1, 2 ** 31 - 1]
    assert upper_bounds([1, 1, 1], [True] * 3) == [715827882, 1431655764, 2 ** 31 - 1]
    assert upper_bounds([1, 3], [True, True]) == [2 ** 29 - 1, 2 ** 31 - 1]
    assert upper_bounds([1, 1, 1], [True, False, True]) == [2 ** 30 - 1, -1, 2 ** 31 - 1]
    assert upper_bounds([1, 1], [False, False]) == [-1, -1]


def test_select_takes_the_first_next_hop_whose_bound_holds_half_the_hash():
    assert select(0, [1, 1], [True, True]) == 0
    assert select((2 ** 30 - 1) << 1 | 1, [1, 1], [True, True]) == 0       # h >> 1 == the bound
    assert select(2 ** 31, [1, 1], [True, True]) == 1
    assert select(0, [1, 1], [False, True]) == 1
    assert select(0, [1, 1], [False, False]) is None
    # a nexthop group keeps its bounds when a member is down, and falls back to the first good one
    assert select_in_group(0, [1, 1], [False, True]) == 1
    assert select_in_group(2 ** 32 - 1, [1, 1, 1], [True, True, False]) == 0


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_flows_spread_evenly_over_n_next_hops(n):
    rnd = random.Random(7)
    counts = [0] * n
    flows = 8000
    for _ in range(flows):
        counts[select(hash32(L4, rnd.getrandbits(32), rnd.getrandbits(32), 17, rnd.getrandbits(16), 4791),
                      [1] * n, [True] * n)] += 1
    chi2 = sum((c - flows / n) ** 2 / (flows / n) for c in counts)
    # chi-square with n-1 degrees of freedom: 99.9th percentile is under 27 for n <= 8
    assert chi2 < 27, counts


def test_each_field_and_the_seed_change_the_draw():
    base = (0x0A000001, 0x0A000105, 17, 49152, 4791)
    h = hash32(L4, *base)
    assert hash32(L4, *base) == h                                           # deterministic
    assert hash32(FlowHash(True, 2), *base) != h
    for k in range(5):
        changed = list(base)
        changed[k] ^= 1
        assert hash32(L4, *changed) != h, f"field {k} is not hashed"
    # L3 ignores protocol and ports; fragments and other protocols hash no ports
    l3 = FlowHash(l4=False, seed=1)
    assert hash32(l3, 1, 2, 17, 3, 4) == hash32(l3, 1, 2, 6, 5, 6)
    assert hash32(L4, 1, 2, 17, 3, 4, fragment=True) == hash32(L4, 1, 2, 17, 0, 0)
    assert hash32(L4, 1, 2, 1, 3, 4) == hash32(L4, 1, 2, 1, 0, 0)


def test_one_bit_of_input_moves_about_half_the_output_bits():
    rnd = random.Random(3)
    flips = []
    for _ in range(2000):
        s, d, p = rnd.getrandbits(32), rnd.getrandbits(32), rnd.getrandbits(16)
        flips.append(bin(hash32(L4, s, d, 17, p, 4791) ^ hash32(L4, s, d, 17, p ^ (1 << rnd.randrange(16)), 4791))
                     .count("1"))
    assert 15 <= sum(flips) / len(flips) <= 17


def test_the_engine_follows_the_kernel_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv(kernel_side.ENV, raising=False)
    monkeypatch.setattr(kernel_side, "SEED_SYSCTL", str(tmp_path / "present"))
    (tmp_path / "present").write_text("0\n")
    assert kernel_side.engine() == "kernel"
    monkeypatch.setattr(kernel_side, "SEED_SYSCTL", str(tmp_path / "absent"))
    assert kernel_side.engine() == ("bpf" if kernel_side.ebpf.supported()
                                    else "kernel")
    for forced in ("kernel", "bpf"):
        monkeypatch.setenv(kernel_side.ENV, forced)
        assert kernel_side.engine() == forced
    monkeypatch.setenv(kernel_side.ENV, "siphash")
    with pytest.raises(LabError, match="LABCTL_ECMP_HASH=.siphash. is not") as err:
        kernel_side.engine()
    assert "auto" in err.value.fix


def test_the_program_is_whole_instructions_whose_jumps_land_inside_it():
    for fh in (L4, FlowHash(l4=False, seed=9)):
        code = kernel_side.program(fh)
        assert len(code) % 8 == 0
        insns = [struct.unpack_from("=BBhi", code, k) for k in range(0, len(code), 8)]
        assert insns[-1][0] == kernel_side.EXIT
        for k, (op, _regs, off, _imm) in enumerate(insns):
            if op & 0x07 == 0x05 and op not in (kernel_side.CALL, kernel_side.EXIT):   # a jump
                assert 0 <= k + 1 + off < len(insns), (k, off)
        # the seed is in the program: another seed, other instructions
        assert kernel_side.program(FlowHash(fh.l4, fh.seed + 1)) != code
