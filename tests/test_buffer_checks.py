"""Buffers, ECN thresholds and template numbers: what the plan gives a WAN port, what it refuses or
notes before anything is built, and what `tc set` refuses on a queue's buffer (no root)."""
from __future__ import annotations

from pathlib import Path

import pytest

from labctl.dataplane import control
from labctl.errors import InputError, LabError, Where
from labctl.plan import qos
from labctl.plan.buffers import format_buffer
from labctl.plan.compile import compile_plan
from labctl.plan.model import LabPlan
from labctl.topology.load import load_topology

ROOT = Path(__file__).resolve().parents[1]
SCALE_ACROSS = ROOT / "topologies" / "scale-across.yml"


def wan_port(plan, node="z1-dci1", port="z2-dci1"):
    return next(i for i in plan.node(node).interfaces if i.name == port)


def plan_of(*sets):
    return compile_plan(load_topology(SCALE_ACROSS, list(sets)))


@pytest.mark.parametrize("km,expected", [(1, 4 * 1024 * 1024), (5, 4 * 1024 * 1024), (9, 4_410_000), (10, 4_900_000)])
def test_the_default_wan_buffer_is_the_larger_of_the_bdp_and_the_default_buffer(km, expected):
    port = wan_port(plan_of(f"distance={km}"))
    assert port.shaping.buffer_bytes == expected
    assert {c.buffer_bytes for c in port.shaping.classes} == {expected}
    assert expected == max(4 * 1024 * 1024, qos.bdp_bytes(400 * 10**9, km * 4900))


def test_an_explicit_wan_buffer_is_exactly_what_it_says_even_below_the_bdp_or_the_default():
    assert wan_port(plan_of("distance=1", "wan_buffer=2MB")).shaping.buffer_bytes == 2_000_000
    assert wan_port(plan_of("distance=100", "wan_buffer=2MB")).shaping.buffer_bytes == 2_000_000


def test_a_wan_buffer_below_one_frame_is_refused_at_the_variable():
    with pytest.raises(InputError) as info:
        plan_of("wan_buffer=1KB")
    assert info.value.where == Where("--set", key="wan_buffer")
    assert "holds less than one frame of 9014 bytes" in info.value.message
    with pytest.raises(InputError, match="one frame of 1514 bytes"):
        plan_of("wan_buffer=1500", "mtu=1500")
    assert wan_port(plan_of("wan_buffer=1514", "mtu=1500")).shaping.buffer_bytes == 1514


def test_a_link_buffer_below_the_ecn_profile_is_a_located_note_not_an_error(tmp_path):
    plan = plan_of("wan_buffer=300KB")
    assert len(plan.notes) == 1       # one note per link, for both its ends
    note = plan.notes[0]
    assert "links[14].buffer" in note and "z1-dci1:z2-dci1" in note
    assert "Kmin of 400KB is at or above the 300KB buffer of class roce, so the queue never marks CE" in note
    assert "fix:" in note
    doc = plan.to_dict()
    assert doc["notes"] == plan.notes and LabPlan.from_dict(doc).notes == plan.notes
    kmax = plan_of("wan_buffer=1MB").notes
    assert len(kmax) == 1 and "Kmax of 1.6MB is above the 1MB buffer" in kmax[0]


def test_a_kmax_above_a_lab_wide_buffer_is_one_note_for_all_its_ports(tmp_path):
    """qos.ecn.rate scales a fast port's Kmax past the default buffer (test_ecn_scaling.py): the
    queue still marks from Kmin, so the plan says so once, at the buffer's key, and builds."""
    lab = tmp_path / "lab.yml"
    lab.write_text("name: x\nnodes:\n  sw1: {kind: switch}\n  h1: {kind: gpu}\n  h2: {kind: gpu}\nlinks:\n"
                   "  - {endpoints: [h1, sw1], rate: 400G}\n  - {endpoints: [h2, sw1], rate: 400G}\n"
                   "qos:\n  ecn: {kmin: 400KB, kmax: 1600KB, rate: 100G}\n")
    (note,) = compile_plan(load_topology(lab)).notes
    assert note.startswith(f"{lab}:10: qos.ecn.kmax: on sw1:h1 and 1 more port(s), the ECN profile's "
                           "Kmax of 6.4MB is above the 4MiB buffer of class roce")
    assert "fix: a buffer of at least 6.4MB at qos.classes[0].buffer, or qos.ecn.kmax at most 4MiB" in note


def test_a_plan_without_notes_writes_no_notes_key():
    doc = plan_of().to_dict()
    assert "notes" not in doc and LabPlan.from_dict(doc).notes == []


def test_an_ecn_profile_scaled_past_a_class_buffer_is_refused_at_the_profile(tmp_path):
    lab = tmp_path / "lab.yml"
    lab.write_text("name: x\nnodes:\n  sw1: {kind: switch}\n  h1: {kind: gpu}\nlinks:\n"
                   "  - {endpoints: [h1, sw1], rate: 400G}\nqos:\n  ecn: {kmin: 1.5MB, kmax: 2MB, rate: 100G}\n")
    with pytest.raises(InputError) as info:
        compile_plan(load_topology(lab))
    assert info.value.where.key == "qos.ecn.kmin" and info.value.where.line == 8
    assert "Kmin of 6MB is at or above the 4MiB buffer" in info.value.message
    assert "scaled to the port's rate by qos.ecn.rate" in info.value.message


@pytest.mark.parametrize("sets,message", [
    (["wan_rate=0"], "template variable 'wan_rate': 0 is not a rate a link can run at: a rate must be more than 0"),
    (["long_rate=0G"], "a rate must be more than 0"),
    (["distance=1e9"], "template variable 'distance': 1000000000 is above the maximum 20000"),
    (["distance=-1e1"], "-10 is below the minimum 0"),
    (["spines=2.5"], "expected a whole number, got 2.5"),
])
def test_bad_template_numbers_are_located_at_the_variable_with_its_range(sets, message):
    with pytest.raises(InputError) as info:
        plan_of(*sets)
    assert info.value.where == Where("--set", key=sets[0].split("=")[0])
    assert message in info.value.message
    assert "give" in info.value.fix


def test_numbers_written_with_an_exponent_are_read_as_numbers():
    plan = plan_of("distance=1.2e1")
    assert plan.links[wan_port(plan).link].latency_ns == 12 * 4900
    assert len([n for n in plan_of("spines=2e0").nodes if "spine" in n.name]) == 4


def test_the_range_is_in_the_fix_of_a_bad_number():
    with pytest.raises(InputError) as info:
        plan_of("distance=1e9")
    assert info.value.fix == "distance is km of fibre between zones; give a number from 0 up to 20000"


# -- tc set: thresholds the target queue can reach --------------------------------------------------

def test_tc_set_refuses_an_ecn_threshold_at_or_above_the_queues_buffer(tmp_path):
    plan = plan_of()                                  # 10 km: the WAN port's buffer is the BDP, 4.9 MB
    node = plan.node("z1-dci1")
    with pytest.raises(LabError) as info:
        control.pick(tmp_path, plan, node, "z2-dci1", None, {"kmin": 6_000_000, "kmax": 8_000_000})
    assert str(info.value).startswith("z1-dci1:z2-dci1 class roce: --kmin 6MB is at or above the queue's buffer "
                                      "of 4.9MB (4900000 B): it would never mark")
    assert "give --kmin below 4.9MB" in info.value.fix
    # a Kmax past the buffer only keeps marking from reaching Pmax: the plan allows it (a profile
    # scaled to a fast port), `tc show` says so, and tc set can put such a value back
    assert control.pick(tmp_path, plan, node, "z2-dci1", None, {"kmin": 1_000_000, "kmax": 8_000_000}) == \
        {"z1-dci1:z2-dci1:3": {"kmin": 1_000_000, "kmax": 8_000_000}}
    picked = control.pick(tmp_path, plan, node, "z2-dci1", None, {"kmin": 1_000_000, "kmax": 4_900_000})
    assert picked == {"z1-dci1:z2-dci1:3": {"kmin": 1_000_000, "kmax": 4_900_000}}


def test_tc_set_refuses_an_xoff_the_lossless_queue_fills_before(tmp_path):
    plan = plan_of()
    leaf = plan.node("z1-leaf1")
    port = leaf.interfaces[0]
    buffer = next(c.buffer_bytes for c in port.shaping.classes if c.lossless)
    with pytest.raises(LabError, match=f"--xoff {format_buffer(buffer)} is at or above the queue's buffer"):
        control.pick(tmp_path, plan, leaf, port.name, None, {"xoff": buffer, "xon": 1000})
    assert control.pick(tmp_path, plan, leaf, port.name, None, {"xoff": buffer - 9014, "xon": 1000})


def test_format_buffer_writes_what_lab_files_write():
    assert [format_buffer(n) for n in (4 << 20, 256 << 10, 300_000, 4_900_000, 1000)] == \
        ["4MiB", "256KiB", "300KB", "4.9MB", "1KB"]


def test_labctl_plan_lists_the_notes_on_the_lab_file():
    """A located note (a buffer the ECN profile cannot mark in) is shown by `labctl plan`, where a
    user looks before `up`, not only in --json."""
    from click.testing import CliRunner
    from labctl.cli import cli
    result = CliRunner().invoke(cli, ["plan", str(ROOT / "topologies" / "scale-across.yml"), "--set", "wan_buffer=300KB"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "notes on the lab file" in text and "links[14].buffer" in text and "never marks CE" in text, text


def test_defaults_buffer_on_a_lab_without_a_delayed_link_is_a_located_note(tmp_path):
    """defaults.buffer: 16MiB on a leaf-spine changed no queue and said nothing."""
    f = tmp_path / "lab.yml"
    f.write_text("name: db\ndefaults:\n  buffer: 16MiB\nnodes:\n  a: {kind: host}\n  b: {kind: host}\n"
                 "links:\n  - endpoints: [a, b]\n")
    plan = compile_plan(load_topology(f))
    assert {c.buffer_bytes for n in plan.nodes for i in n.interfaces for c in i.shaping.classes} != {16 << 20}
    (note,) = [n for n in plan.notes if "defaults.buffer" in n]
    assert "lab.yml:3" in note and "qos.classes[k].buffer" in note, note
    f.write_text(f.read_text().replace("  buffer: 16MiB\n", "  buffer: 16MiB\n  latency: 1ms\n"))
    assert not [n for n in compile_plan(load_topology(f)).notes if "changes nothing" in n]


def test_tc_set_rate_with_a_class_is_refused_not_applied_to_the_whole_port():
    """`tc set leaf1:spine1 --class bogus --rate 30M` reshaped the whole port and ignored --class."""
    from labctl.lifecycle.runtime import tc_check
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml"))
    with pytest.raises(LabError, match="--rate shapes the port leaf1:spine1 whole"):
        tc_check(None, plan, plan.node("leaf1"), "spine1", class_name="bogus", rate="30M")
    assert tc_check(None, plan, plan.node("leaf1"), "spine1", rate="30M") == (30_000_000, {})


def test_tc_set_names_an_unknown_class_and_a_pmax_out_of_range_with_fixes_of_their_own(tmp_path):
    """`--class rcoe --ecn off` said "no class takes ['ecn']", and `--pmax 2` was told to give
    both thresholds so that low <= high."""
    from labctl.lifecycle.runtime import tc_check
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml"))

    class Lab:
        path = tmp_path
    with pytest.raises(LabError, match="has no class 'rcoe' \\(did you mean 'roce'\\?\\)"):
        tc_check(Lab, plan, plan.node("leaf1"), "spine1", class_name="rcoe", ecn="off")
    with pytest.raises(LabError) as err:
        tc_check(Lab, plan, plan.node("leaf1"), "spine1", pmax="2")
    assert "not a probability" in str(err.value) and "from 0 to 1" in err.value.fix
