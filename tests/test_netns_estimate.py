"""The estimate against a real lab: the kernel's ECMP is the uniform hash the model assumes, and a
measured run is predicted within the error the bundled calibration reports."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import require_root
from labctl import lifecycle as labmod
from labctl.cli import cli
from labctl.estimate import calibration, labrun
from labctl.estimate.model import ideal_time, lab_params, Params
from labctl.traffic.run import run_workload
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.netns


def test_the_kernels_ecmp_spreads_flows_as_the_model_assumes(built_lab):
    """400 source ports from one GPU to a GPU under another leaf: the kernel's spine choices are a fair
    coin (binomial, 4 sigma), and two flows share a spine about half the time, as the model draws."""
    require_root()
    plan = built_lab(ROOT / "topologies" / "leaf-spine.yml")
    dst = next(i.address.split("/")[0] for n in plan.nodes if n.name == "srv2-gpu1" for i in n.interfaces
               if i.fabric == "backend")
    choices = []
    for sport in range(49152, 49152 + 400):
        hops = labmod.trace_path(plan, "srv1-gpu0", dst, sport, 4791)
        spine = [h["node"] for h in hops if h["node"].startswith("spine")]
        assert len(spine) == 1, hops
        choices.append(spine[0] == "spine1")
    ones = sum(choices)
    assert abs(ones - 200) <= 4 * 10, f"{ones}/400 flows on spine1"
    pairs = np.array(choices[0::2]) == np.array(choices[1::2])
    assert 0.5 - 4 * 0.035 <= pairs.mean() <= 0.5 + 4 * 0.035


def test_a_lab_run_is_predicted_within_the_calibrations_error(built_lab, tmp_path):
    """A fresh 8-rank all-reduce, predicted by `labctl estimate --check`. The model predicts the
    network-bound time; a host that loses its CPUs only slows a run (a CI run measured -13.5% with
    4.2 s of its 10 s stolen by the hypervisor), so up to three runs are made and one must be within
    the calibration's error. Every run must still deliver every byte and trace its placement."""
    require_root()
    plan = built_lab(ROOT / "topologies" / "leaf-spine.yml")
    wf = tmp_path / "ar.yml"
    wf.write_text("name: ar\ncollective: all_reduce\nsizes: [16MB]\nparticipants: all\n")
    from labctl import state
    cal = calibration.load()
    tried = []
    for attempt in range(3):
        run_dir = tmp_path / f"run{attempt}"
        doc = run_workload(plan, state.lab_dir(plan.lab), load_workload(wf), run_dir, trace=labmod.trace_path)
        assert doc["results"][0]["wrong"] == 0
        assert len(doc["fabric_paths"]) == 2                      # the ring's two hops between servers
        sample = labrun.samples(run_dir)[0]
        assert sample["placement"] == "recorded"
        feats = labrun.features(sample)
        assert ideal_time(feats, lab_params(Params())) == pytest.approx(doc["results"][0]["ideal_s"], rel=1e-6)
        res = CliRunner().invoke(cli, ["estimate", "--check", str(run_dir), "--json"])
        checked = json.loads(res.output)
        assert checked["allowed_error"] == pytest.approx(cal["max_error"] + calibration.RUN_TO_RUN)
        row = checked["rows"][0]
        tried.append(f"measured {row['measured_s']:.3f} s, model {row['predicted_s']:.3f} s, error {row['error']:+.1%}")
        if res.exit_code == 0 and row["within"]:
            break
        # a run faster than the model is no stalled host: that is the model's error, and final
        assert row["error"] < 0, tried[-1]
    assert res.exit_code == 0 and row["within"], \
        f"{'; '.join(tried)}: beyond {cal['max_error']:.1%} + {calibration.RUN_TO_RUN:.0%} run to run"
