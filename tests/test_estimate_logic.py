"""The estimate model (pure): hash model, fabrics, phases, α-β, ECMP draws, calibration, CLI."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from labctl.cli import cli
from labctl.errors import LabError
from labctl.estimate import calibration, collectives, hashing, labrun, report
from labctl.estimate.fabric import NO_LINK, Clos
from labctl.estimate.model import Params, ideal_time, lab_params, payload_Bps, phase_features
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import roce, schedule, sender
from labctl.traffic.bound import ideal_seconds
from labctl.traffic.pool import gpu_ranks

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"


def test_ports_and_qps_are_the_agents_own():
    rng = random.Random(7)
    for _ in range(500):
        r, p, k = rng.randrange(1024), rng.randrange(1024), rng.randrange(8)
        assert int(hashing.qpn(r, p, k)) == sender.qpn(r, p, k)
        assert int(hashing.udp_sport(hashing.qpn(r, p, k), hashing.qpn(p, r, k))) == \
            roce.udp_sport(sender.qpn(r, p, k), sender.qpn(p, r, k))


def test_hash_threshold_selection_is_uniform_and_bounded():
    assert int(hashing.select(0, 16)) == 0 and int(hashing.select(2 ** 31 - 1, 16)) == 15
    h = hashing.flow_hash(np.arange(64000), np.arange(64000) + 7, 49152, seed=3)
    assert h.max() < 2 ** 31
    counts = np.bincount(hashing.select(h, 16), minlength=16)
    assert np.all(np.abs(counts - 4000) < 5 * math.sqrt(4000))   # 5 sigma of a binomial
    # another seed is another draw: about half the flows change spine on two spines
    moved = (hashing.select(h, 2) != hashing.select(hashing.flow_hash(np.arange(64000), np.arange(64000) + 7,
                                                                      49152, seed=4), 2)).mean()
    assert 0.48 < moved < 0.52


def test_the_bundled_lab_and_its_model_agree_on_the_fabric():
    plan = compile_plan(load_topology(LEAF_SPINE))
    lab, spines = labrun.fabric_from_plan(plan)
    model = Clos.leaf_spine(spines=2, leaves=4, servers=2, gpus_per_server=4, gpu_bps=400e9 / plan.dilation,
                            nvlink_bps=7200e9 / plan.dilation)
    assert spines == ["spine1", "spine2"]
    assert list(lab.leaf_of) == list(model.leaf_of)
    assert (lab.nic_bps, lab.uplink_bps, lab.nvlink_bps) == pytest.approx((model.nic_bps, model.uplink_bps,
                                                                            model.nvlink_bps))


@pytest.mark.parametrize("sets", [[], ["scale_up=false"], ["servers=8", "gpus_per_server=8", "leaves=8", "spines=4"]])
def test_the_models_bound_is_the_labs_bound(sets):
    """The same α-β bound as the agents' reports (traffic.pool.ideal_seconds), from the model's phases."""
    plan = compile_plan(load_topology(LEAF_SPINE, sets=sets))
    fabric, _ = labrun.fabric_from_plan(plan)
    nodes = gpu_ranks(plan)
    order = np.array(sorted(nodes))
    for coll, sched in (("all_reduce", schedule.ring_all_reduce(list(order), 16_000_000)),
                        ("reduce_scatter", schedule.ring_reduce_scatter(list(order), 16_000_000))):
        feats = [phase_features(fabric, ph, [1]) for ph in collectives.phases(coll, order, 16e6, fabric.gpus_per_server)]
        assert ideal_time(feats, lab_params(Params())) == pytest.approx(ideal_seconds(plan, sched, nodes), rel=1e-6)


def test_phases_move_what_the_schedules_move():
    g, servers = 4, 3
    ranks = list(range(g * servers))
    sched = schedule.hierarchical_all_reduce([ranks[i * g:(i + 1) * g] for i in range(servers)], 12_000_000)
    phases = collectives.phases("hier_all_reduce", np.array(ranks), 12_000_000, g)
    assert [p.name for p in phases] == ["intra_reduce_scatter", "inter_all_reduce", "intra_all_gather"]
    for p in phases:
        moved = sum(t.nbytes for t in sched.transfers if t.phase == p.name)
        assert p.steps * p.chunk * len(p.src) == pytest.approx(moved, rel=1e-3)
        assert p.steps == sched.steps(p.name)
    ar = collectives.phases("all_reduce", np.arange(8), 8e6, 4)[0]
    assert (ar.steps, ar.chunk) == (14, 1e6)
    with pytest.raises(LabError, match="whole servers"):
        collectives.phases("hier_all_reduce", np.arange(6), 1e6, 4)


def test_fabric_sizes_and_tiers():
    two = Clos.for_gpus(2048, radix=64)
    assert two.tiers == 2 and two.leaves == 64 and two.spines == 32
    three = Clos.for_gpus(16384, radix=64)
    assert three.tiers == 3 and three.leaves_per_pod == 32 and three.pods * three.leaves_per_pod >= three.leaves
    assert np.bincount(three.leaf_of).max() == 32              # a leaf's 32 downlinks, one GPU each
    big = Clos.for_gpus(100_000, radix=128)
    assert big.tiers == 3 and np.bincount(big.leaf_of).max() <= 64
    with pytest.raises(LabError, match="--radix 128"):
        Clos.for_gpus(100_000, radix=64)


def test_paths_follow_the_tiers():
    f = Clos.for_gpus(16384, radix=64)
    o = f._offsets()
    src = np.array([0, 0, 0, 0])
    dst = np.array([1, 8, 32 * 8, 16000])          # NVLink; same leaf (rail 0, next server); same pod; another pod
    links = f.paths(src, dst, np.zeros(4, dtype=np.int64), seed=1)
    used = [(row != NO_LINK).sum() for row in links]
    assert used == [2, 2, 4, 6]
    assert o[2] <= links[0, 0] < o[3]                          # NVLink tx
    up, down = links[2, 2] - o[4], links[2, 3] - o[5]
    assert up % f.spines == down % f.spines                    # up and down through the same spine


def test_collisions_match_balls_in_bins():
    """The 64-rank rail ring of the 1,024-GPU lab: 16 hops leave each of a rail's 4 leaves over 16
    spines. The model's busiest uplink, over many draws, is the balls-in-bins maximum."""
    f = Clos.leaf_spine(spines=16, leaves=4, servers=64, gpus_per_server=1, scale_up=False)
    ph = collectives.phases("all_reduce", np.arange(64), 4e6, 1)[0]
    feats = phase_features(f, ph, list(range(1, 201)))
    rng = np.random.default_rng(1)
    sim = [max(np.bincount(rng.integers(0, 16, 16)).max() for _ in range(4)) for _ in range(4000)]
    assert np.mean(feats.step_s) / feats.ideal_step_s == pytest.approx(np.mean(sim), rel=0.08)


def test_more_qps_average_their_draws_and_one_seed_everywhere_polarises():
    f = Clos.leaf_spine(spines=2, leaves=4, servers=2, gpus_per_server=4, scale_up=False)
    ph = collectives.phases("all_reduce", np.arange(8), 16e6, 4)[0]
    one = np.mean(phase_features(f, ph, list(range(1, 201)), qps=1).step_s)
    eight = np.mean(phase_features(f, ph, list(range(1, 201)), qps=8).step_s)
    assert eight < one
    big = Clos.for_gpus(16384, radix=64, nvlink_bps=0)
    order = np.arange(0, 16384, 8)
    ph = collectives.phases("all_reduce", np.random.default_rng(2).permutation(order), 1e9, 8)[0]
    core = [t for t in phase_features(big, ph, [1], seed_mode="same").loads if t["tier"] == "spine->core"][0]
    spread = [t for t in phase_features(big, ph, [1], seed_mode="per-switch").loads if t["tier"] == "spine->core"][0]
    assert core["max_flows"] > 2 * spread["max_flows"]         # same hash at leaf and spine: one core per spine


def _synthetic(kappa, eta):
    """Samples whose measured time is the model's own under known lab parameters."""
    p = lab_params(Params(eta=eta, kappa_s=kappa))
    out = []
    for n, servers, size, spines in ((8, 2, 16e6, 2), (16, 4, 16e6, 4), (32, 32, 4e6, 8), (64, 64, 4e6, 16)):
        g = n // servers
        f = Clos.leaf_spine(spines=spines, leaves=4, servers=servers, gpus_per_server=g, gpu_bps=400e9 / (500 * n),
                            scale_up=g > 1)
        for coll in ("all_reduce", "reduce_scatter"):
            feats = [phase_features(f, ph, [1], ranks=n) for ph in collectives.phases(coll, np.arange(n), size, g)]
            s = {"run": f"{coll}{n}", "workload": coll, "collective": coll, "size": size, "ranks": n, "qps": 1,
                 "dilation": 1, "lab_ideal_s": 0, "phases": [x.to_dict() for x in feats]}
            s["measured_s"] = calibration.predict(s, p)
            out.append(s)
    return out


def test_calibration_recovers_known_parameters():
    samples = _synthetic(kappa=2e-3, eta=0.9)
    result = calibration.evaluate(samples)
    assert result["params"]["eta"] == pytest.approx(0.9, abs=0.0015)
    assert result["params"]["kappa_s"] == pytest.approx(2e-3, rel=0.05)
    assert result["max_error"] < 0.02


def test_calibration_reports_the_error_it_would_make():
    samples = _synthetic(kappa=1e-3, eta=0.95)
    samples[0]["measured_s"] *= 1.3                               # one run the model cannot explain
    result = calibration.evaluate(samples)
    row = result["rows"][0]
    assert abs(row["loo_error"]) > 0.15 and result["max_error"] == pytest.approx(abs(row["loo_error"]))


def test_the_bundled_calibration_is_real_and_says_where_it_comes_from():
    cal = calibration.load()
    assert "bench/calibrate_estimate.py" in cal["provenance"]
    ranks = {r["ranks"] for r in cal["rows"]}
    assert min(ranks) == 8 and max(ranks) == 64
    assert all(r["measured_s"] > r["lab_ideal_s"] * 0.95 for r in cal["rows"])   # nothing beats the bound
    assert 0.5 <= cal["params"]["eta"] <= 1.0
    # re-evaluating the stored samples gives the stored figures: the file is its own evidence
    again = calibration.evaluate(cal["samples"])
    assert again["max_error"] == pytest.approx(cal["max_error"], rel=1e-6)


def test_estimate_cli_is_a_model_and_says_so(tmp_path):
    res = CliRunner().invoke(cli, ["estimate", "--gpus", "16384", "--size", "1GB", "--json", "--seeds", "4"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert "model, not an emulation" in doc["note"]
    g, s, size = 8, 2048, 1e9
    nic, nvl = payload_Bps(400e9), payload_Bps(7200e9)   # NVLink 5, the default
    bound = 2 * (g - 1) * (3.4e-6 + size / g / nvl) + 2 * (s - 1) * (14e-6 + size / g / s / nic)
    assert doc["bound_s"] == pytest.approx(bound, rel=1e-6)
    assert doc["bound_s"] <= doc["p50_s"] <= doc["p99_s"] <= doc["worst_s"]
    text = CliRunner().invoke(cli, ["estimate", "--gpus", "8192", "--seeds", "2"]).output
    assert "off by at most" in text and "not an emulation" in text


def test_estimate_cli_refuses_bad_input(tmp_path):
    res = CliRunner().invoke(cli, ["estimate", "--gpus", "100000", "--radix", "64"])
    assert res.exit_code == 2 and "--radix 128" in res.output
    res = CliRunner().invoke(cli, ["estimate", "--check", str(tmp_path)])
    assert res.exit_code == 2 and "not a run directory" in res.output
    bad = tmp_path / "cal.json"
    bad.write_text("{}")
    res = CliRunner().invoke(cli, ["estimate", "--calibration", str(bad)])
    assert res.exit_code == 2 and "cal.json: params: missing" in res.output
    assert report.ranks_order(Clos.for_gpus(64, radix=16), "rail").tolist() == list(range(0, 64, 8))


def test_a_run_directory_that_is_not_one_is_refused_without_reading_forever(tmp_path):
    """Red team: --calibrate read results.json through a link to /dev/zero until memory ran out,
    and a results.json of {} ended in a KeyError traceback."""
    from labctl.errors import InputError
    from labctl.estimate import labrun
    (tmp_path / "results.json").symlink_to("/dev/zero")
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(InputError, match="not a regular file"):
        labrun.samples(tmp_path)
    (tmp_path / "results.json").unlink()
    (tmp_path / "results.json").write_text("{}")
    with pytest.raises(InputError, match="not what `labctl run` writes"):
        labrun.samples(tmp_path)
