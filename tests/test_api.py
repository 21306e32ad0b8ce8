"""The Python API as a Mininet user would use it: a lab from code, `with` that always takes it down,
commands with node names, pingall, a workload as a dict, counters, a link cut and restored; and the
three scripts in examples/."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import lab_namespaces, require_root
from labctl import Lab, PingResult, Topology
from labctl.errors import InputError, LabError

ROOT = Path(__file__).resolve().parents[1]


def small(name: str) -> Topology:
    t = Topology(name, dilation=4000)
    t.add_switch("sw1")
    t.add_switch("sw2")
    for g in ("g0", "g1", "g2"):
        t.add_gpu(g)
    t.add_link("g0", "sw1", rate="400G")
    t.add_link("g1", "sw1", rate="400G")
    t.add_link("g2", "sw2", rate="400G")
    t.add_link("sw1", "sw2", rate="800G")
    return t


def test_a_topology_built_in_code_is_checked_exactly_like_a_file():
    t = small("ltapi")
    t.add_link("g0", "sw9")
    with pytest.raises(InputError, match=r"<Topology ltapi>:\d+: links\[4\].endpoints\[1\]: .*'sw9'"):
        Lab(t).up()
    with pytest.raises(LabError, match="is not up"):
        Lab(small("ltapi")).node("g0")


@pytest.mark.netns
def test_the_api_builds_uses_and_always_removes_a_lab(state_dir, lab_name, tmp_path):
    require_root()
    with pytest.raises(RuntimeError):
        with Lab(small(lab_name)) as lab:
            assert lab_namespaces(lab_name + "-")
            result = lab.pingall()
            assert isinstance(result, PingResult) and result == 0 and result.tried == 6
            out = lab.node("g0").cmd(["ping", "-c", "1", "-W", "2", "g2"])        # a node name as address
            assert out.returncode == 0 and lab.plan.node("g2").interfaces[0].address.split("/")[0] in out.stdout
            with pytest.raises(TypeError):
                lab.node("g0").cmd("ping g2")                                   # no shell strings
            doc = lab.run({"name": "ar", "collective": "all_reduce", "sizes": ["1MB"], "participants": "all"},
                          tmp_path / "run")
            assert doc["results"][0]["wrong"] == 0 and (tmp_path / "run" / "results.json").exists()
            assert any(r["node"] == "sw1" and r["sent_packets"] > 0 for r in lab.counters(busy=True))
            assert lab.losses()["total"] == 0
            assert lab.link("sw1:sw2", up=False) > 0
            assert lab.pingall().failed and lab.link("sw1:sw2", up=True) > 0
            assert lab.pingall() == 0
            raise RuntimeError("the block fails: the lab must still come down")
    assert lab_namespaces(lab_name + "-") == [] and not (state_dir / lab_name).exists()


@pytest.mark.netns
# allreduce_sweep.py compares two draws' times against their bounds: beside the first part's other
# worker and the VM tier the spread draw itself ran at 1.72x its bound (CI, 2026-12-07), so it is timed
# in the second part, as pfc_compare.py's loss is (beside nothing but CI's VM smoke in an idle cgroup)
@pytest.mark.parametrize("script, args", [("ping_check.py", []),
                                          pytest.param("allreduce_sweep.py", ["--seeds", "1,4", "--size", "2MB"],
                                                       marks=pytest.mark.solo),
                                          pytest.param("pfc_compare.py", [], marks=pytest.mark.solo)])
def test_the_examples_run(state_dir, lab_name, tmp_path, script, args):
    require_root()
    extra = ["--out", str(tmp_path / "runs")] if script != "ping_check.py" else []
    r = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--name", lab_name, *args, *extra],
                       capture_output=True, text=True, env={**os.environ, "LABCTL_STATE_DIR": str(state_dir)},
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert lab_namespaces(lab_name + "-") == []
    if script == "ping_check.py":
        assert "80 of 80 pairs reachable" in r.stdout and "spine1" in r.stdout and "spine2" in r.stdout
    elif script == "allreduce_sweep.py":
        ratios = {line.split()[0]: float(line.split()[3]) for line in r.stdout.splitlines()[1:]}
        # seed 1 puts two ring hops on one spine link: half its rate, so about twice the ideal time;
        # seed 4 spreads them. A 2 MB message carries a fixed per-step cost of up to 0.4 x ideal
        # (measured 0.28-0.39), which narrows the gap from 2x to about 1.5x.
        assert ratios["1"] >= 1.8 and ratios["1"] >= 1.3 * ratios["4"], r.stdout
    else:
        assert "as expected: lossless with PFC, lossy without" in r.stdout


@pytest.mark.netns
def test_the_api_builds_on_mininet_too(state_dir, lab_name):
    require_root()
    with Lab(small(lab_name), backend="mininet") as lab:
        assert lab.record.read_state()["backend"] == "mininet"
        assert lab.pingall() == 0
        out = lab.node("g0").cmd(["ping", "-c", "1", "-W", "2", "g2"])
        assert out.returncode == 0 and "1 received" in out.stdout
    assert lab_namespaces(lab_name + "-") == [] and not (state_dir / lab_name).exists()
