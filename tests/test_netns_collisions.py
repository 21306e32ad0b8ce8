"""Namespaces across labs, on real namespaces (issue #31, the first medium finding).

A lab's namespaces are <lab>-<node>: lab `dc` with node `east-leaf1` and lab `dc-east` with node
`leaf1` would both make `dc-east-leaf1`. The second `up` is refused before it makes anything,
naming the lab that has the namespace (it named the wrong one, and left a "building" record), and
`down` of either leaves the other's ping working. The journal holds each namespace's identity
(device, inode, cookie) and the boot: `down` removes only a namespace that is provably the one its
lab made, and leaves one that merely has the name, with a message."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import lab_namespaces, require_root
from labctl import lifecycle as labmod
from labctl import procs, state
from labctl.errors import LabError

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[1]


def lab_file(tmp_path: Path, name: str, router: str) -> Path:
    """h1 -- ROUTER -- h2 (chain.yml), with the router named `router`."""
    f = tmp_path / f"{name}.yml"
    f.write_text(f"name: {name}\ndilation: 1\ndefaults: {{rate: 100M}}\nnodes:\n  {router}: {{kind: router}}\n"
                 f"  h1: {{kind: host}}\n  h2: {{kind: host}}\nlinks:\n  - endpoints: [h1, {router}]\n"
                 f"  - endpoints: [{router}, h2]\n")
    return f


def pings(name: str) -> bool:
    tried, failed = labmod.pingall(labmod.load_plan(state.lab_dir(name)))
    return tried > 0 and not failed


def test_labs_whose_namespaces_would_collide_never_both_come_up(state_dir, lab_name, tmp_path):
    require_root()
    dc, dc_east = lab_name, f"{lab_name}-east"
    shared = f"{dc_east}-leaf1"
    files = {dc: lab_file(tmp_path, dc, "east-leaf1"), dc_east: lab_file(tmp_path, dc_east, "leaf1")}
    try:
        for first, second in ((dc_east, dc), (dc, dc_east)):
            labmod.up(str(files[first]))
            assert shared in lab_namespaces(shared) and pings(first)
            with pytest.raises(LabError) as info:
                labmod.up(str(files[second]))
            message = str(info.value)
            assert f"lab {first!r} has it" in message and f"labctl down {first}" in message, message
            assert f"labctl down {second}`" not in message
            # refused before anything of the second lab existed: no namespace, no record
            assert not (state_dir / second).exists()
            assert lab_namespaces(f"{second}-h") == []
            assert pings(first), "the refused up broke the lab that has the namespace"
            with pytest.raises(LabError, match="no lab named"):
                labmod.down(second)
            assert pings(first)
            labmod.down(first)
            assert lab_namespaces(dc) == []
    finally:
        for name in (dc, dc_east):
            if (state_dir / name).exists():
                labmod.down(name)


def test_labs_whose_names_are_prefixes_of_each_other_come_up_side_by_side(state_dir, lab_name, tmp_path):
    """Lab `dc` and lab `dc-east` without a shared name: both up; `down` of either leaves the
    other's namespaces (all of which start with `dc-`) and its ping alone."""
    require_root()
    dc, dc_east = lab_name, f"{lab_name}-east"
    try:
        labmod.up(str(lab_file(tmp_path, dc, "core")))
        labmod.up(str(lab_file(tmp_path, dc_east, "leaf1")))
        assert pings(dc) and pings(dc_east)
        labmod.down(dc)
        assert lab_namespaces(f"{dc}-h") == [] and len(lab_namespaces(dc_east)) == 3
        assert pings(dc_east)
        labmod.up(str(lab_file(tmp_path, dc, "core")))
        labmod.down(dc_east)
        assert pings(dc) and lab_namespaces(dc_east) == []
    finally:
        for name in (dc, dc_east):
            if (state_dir / name).exists():
                labmod.down(name)


def test_down_removes_only_the_namespaces_its_journal_can_prove(state_dir, lab_name, tmp_path, capfd):
    """Each namespace's identity and the boot are journaled; a namespace of the lab's name that
    something else made (after the lab's own was deleted, or after a restart) is left alone."""
    require_root()
    labmod.up(str(lab_file(tmp_path, lab_name, "r1")))
    d = state.lab_dir(lab_name)
    ids = d.namespace_ids()
    assert set(ids) == {f"{lab_name}-{n}" for n in ("h1", "r1", "h2")}
    assert {boot for _, boot in ids.values()} == {procs.boot_id()} and len(procs.boot_id()) == 36
    ino = os.stat(f"/var/run/netns/{lab_name}-h1")
    assert ids[f"{lab_name}-h1"][0].startswith(f"{ino.st_dev}:{ino.st_ino}:")
    theirs = [f"{lab_name}-h2", f"{lab_name}-r1"]
    try:
        # h2: deleted behind the lab's back, and made again by someone else (same boot, same name)
        subprocess.run(["ip", "netns", "del", theirs[0]], check=True)
        subprocess.run(["ip", "netns", "add", theirs[0]], check=True)
        # r1: likewise, and the journal's boot ID is another one, as after a restart
        subprocess.run(["ip", "netns", "del", theirs[1]], check=True)
        subprocess.run(["ip", "netns", "add", theirs[1]], check=True)
        text = d.journal_file.read_text().replace(f"{theirs[1]} {ids[theirs[1]][0]} {procs.boot_id()}",
                                                   f"{theirs[1]} {ids[theirs[1]][0]} 00000000-0000-0000-0000-000000000000")
        d.journal_file.write_text(text)
        removed = labmod.down(lab_name)
        assert removed == [f"{lab_name}-h1"]
        assert sorted(lab_namespaces(lab_name)) == sorted(theirs), "down removed a namespace it did not make"
        err = capfd.readouterr().err
        assert f"left namespace {theirs[0]} alone: it is not the namespace this lab made" in err, err
        assert f"left namespace {theirs[1]} alone: the machine restarted" in err, err
        assert not d.path.exists()
    finally:
        for ns in theirs:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_second_up_waits_for_the_first(state_dir, lab_name, tmp_path):
    """Two `up`s at once: the second waits on the state directory's lock (and says so), then finds
    the namespaces' names as the first left them."""
    require_root()
    env = {**os.environ, "LABCTL_STATE_DIR": str(state_dir)}
    holder = subprocess.Popen([sys.executable, "-P", "-c", "import sys, time; sys.path.insert(0, %r)\n"
                               "from labctl import state\nwith state.lock('labctl up other'):\n"
                               "    print('held', flush=True); time.sleep(3)" % str(ROOT)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        r = subprocess.run([str(Path(sys.executable).parent / "labctl"), "up", str(lab_file(tmp_path, lab_name, "r1"))],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        assert f"waiting for another labctl (process {holder.pid}, labctl up other)" in r.stderr, r.stderr
        assert time.monotonic() - t0 > 2 and holder.wait(5) == 0
    finally:
        holder.kill()
        holder.wait()
        if (state_dir / lab_name).exists():
            labmod.down(lab_name)


def test_no_command_runs_a_labctl_or_mininet_folder_of_the_current_directory(state_dir, lab_name, tmp_path):
    """A labctl/ (and a mininet/) planted where the user stands never runs, whichever command:
    up (which starts the controller), cli -c (counters, run), run, doctor, down. Each runs as the
    installed `labctl` does, from the planted directory."""
    require_root()
    from test_hardening import plant
    trap = tmp_path / "trap"
    trap.mkdir()
    markers = [plant(trap), plant(trap, "mininet")]
    (trap / "lab.yml").write_text(f"name: {lab_name}\ndilation: 4000\nnodes:\n  sw: {{kind: switch}}\n"
                                  "  g0: {kind: gpu}\n  g1: {kind: gpu}\nlinks:\n  - endpoints: [g0, sw]\n"
                                  "  - endpoints: [g1, sw]\n")
    (trap / "w.yml").write_text("name: w\ncollective: all_reduce\nsizes: [64KB]\nparticipants: all\n")
    labctl = str(Path(sys.executable).parent / "labctl")
    env = {**os.environ, "LABCTL_STATE_DIR": str(state_dir)}
    commands = [["up", "lab.yml"], ["cli", lab_name, "-c", "counters; run w.yml --out run1"],
                ["run", "w.yml", "--lab", lab_name, "--out", "run2"], ["doctor", "--json"], ["down", lab_name]]
    try:
        for argv in commands:
            r = subprocess.run([labctl, *argv], capture_output=True, text=True, cwd=trap, env=env, timeout=600)
            assert r.returncode == 0, (argv, r.stdout[-2000:], r.stderr[-2000:])
            assert not any(m.exists() for m in markers), f"planted code ran during labctl {' '.join(argv)}"
            if argv[0] == "up":
                assert state.lab_dir(lab_name).read_state().get("controller_pid"), "no helper was started"
        assert (trap / "run1" / "results.json").exists() and (trap / "run2" / "results.json").exists()
    finally:
        if (state_dir / lab_name).exists():
            labmod.down(lab_name)
