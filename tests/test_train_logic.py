"""The train: step: bytes per dimension against the published formulas, 1F1B, skew, placement, bad files."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from labctl.errors import InputError
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology
from labctl.traffic import fabrics, train_model as tm, train_run
from labctl.traffic import schedule as sch
from labctl.traffic.pool import gpu_ranks
from labctl.traffic.train import TrainStep, build_step, one_f_one_b
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
BAD = sorted((Path(__file__).parent / "bad-workloads").glob("*.yml"))


def sent_by(ts, phase):
    out = Counter()
    for t in ts:
        if t.phase == phase:
            out[t.src] += t.nbytes
    return out


def step(model="llama-7b", n=16, tp=2, pp=2, dp=None, ep=1, placement=("tp", "pp", "dp"), **kw):
    m = tm.transformer(model, layers=kw.pop("layers", 4))
    return TrainStep(m, tm.degrees(n, tp, pp, dp, ep), placement, scale=1e-3, time_factor=4, **kw)


def test_tp_all_reduce_bytes_per_rank_follow_2_n_minus_1_over_n():
    cfg = step(tp=4, pp=2, micro_batches=3)
    b = build_step(cfg, list(range(16)))
    s_bytes = cfg.activation_bytes * cfg.scale // 4 * 4
    layers = 2
    per_rank = 4 * layers * cfg.micro_batches * 2 * 3 / 4 * s_bytes   # 4 all-reduces per layer and mb
    # Megatron-LM's scatter-gather: each stage receives every micro-batch once (stage 1 forward,
    # stage 0 backward) as 1/tp shares, and all-gathers it over tp: (tp-1)/tp of b*s*h per rank
    per_rank += cfg.micro_batches * 3 / 4 * s_bytes
    got = sent_by(b.transfers, "tp")
    assert len(got) == len(b.ranks) and all(v == pytest.approx(per_rank, rel=1e-3) for v in got.values())


def test_only_a_received_micro_batch_is_all_gathered_and_not_with_sequence_parallel():
    def tp_bytes(**kw):
        return sum(sent_by(build_step(step(**kw), list(range(16))).transfers, "tp").values())
    one = step(tp=4, pp=1, micro_batches=2)
    all_reduces = 16 * 4 * 4 * 2 * 2 * 3 / 4 * (one.activation_bytes * one.scale // 4 * 4)
    assert tp_bytes(tp=4, pp=1, micro_batches=2) == pytest.approx(all_reduces, rel=1e-3)   # no stage receives
    # pp=4: the two middle stages receive both ways, the end stages one way: 6 receptions of m per dp replica
    with_gathers = tp_bytes(tp=2, pp=4, dp=2, micro_batches=2)
    sp = tp_bytes(tp=2, pp=4, dp=2, micro_batches=2, sequence_parallel=True)
    s_bytes = one.activation_bytes * one.scale // 2 * 2
    assert with_gathers - sp == pytest.approx(2 * 6 * 2 * 2 * 1 / 2 * s_bytes, rel=1e-3)


def test_sequence_parallel_sends_the_same_tp_bytes_as_all_reduce():
    a = build_step(step(tp=4, pp=1, micro_batches=2), list(range(16)))
    b = build_step(step(tp=4, pp=1, micro_batches=2, sequence_parallel=True), list(range(16)))
    assert sum(sent_by(a.transfers, "tp").values()) == pytest.approx(sum(sent_by(b.transfers, "tp").values()),
                                                                     rel=1e-3)


def test_pp_sends_activations_and_gradients_per_micro_batch():
    cfg = step(tp=2, pp=4, dp=2, micro_batches=5)
    b = build_step(cfg, list(range(16)))
    pp = sent_by(b.transfers, "pp")
    share = cfg.activation_bytes * cfg.scale / cfg.degrees.tp
    # a middle stage sends forward and back, an end stage one way only
    assert sorted(set(pp.values())) == [pytest.approx(5 * share, rel=1e-3), pytest.approx(10 * share, rel=1e-3)]
    assert sum(pp.values()) == pytest.approx(2 * 3 * 5 * 2 * cfg.activation_bytes * cfg.scale, rel=1e-3)


def test_dp_reduce_scatter_and_all_gather_are_n_minus_1_over_n_each():
    cfg = step(tp=2, pp=2, dp=4)
    b = build_step(cfg, list(range(16)))
    shard_bytes = cfg.model.params_per_layer * 2 / 2 * 2 * cfg.scale    # 2 layers/stage, /tp, bf16
    got = sent_by(b.transfers, "dp")
    assert len(got) == len(b.ranks) and all(v == pytest.approx(2 * 3 / 4 * shard_bytes, rel=1e-3) for v in got.values())


def test_hsdp_adds_a_replica_all_reduce_of_the_shard():
    cfg = step(tp=2, pp=2, dp=4, dp_shard=2)
    b = build_step(cfg, list(range(16)))
    s = cfg.model.params_per_layer * 2 / 2 * 2 * cfg.scale
    expect = 2 * 1 / 2 * s + 2 * (2 - 1) / 2 * (s / 2)          # RS + AG in 2, AR of s/2 in 2
    got = sent_by(b.transfers, "dp")
    assert len(got) == len(b.ranks) and all(v == pytest.approx(expect, rel=1e-3) for v in got.values())


def test_uniform_expert_all_to_all_is_n_minus_1_over_n():
    cfg = step("mixtral-8x7b", tp=1, pp=1, dp=8, ep=8, n=8, layers=2, micro_batches=1)
    b = build_step(cfg, list(range(8)))
    tokens_bytes = cfg.activation_bytes * cfg.scale * cfg.model.top_k
    per = 4 * 2 * 7 / 8 * tokens_bytes      # dispatch + combine, fwd + bwd, 2 layers
    got = sent_by(b.transfers, "ep")
    assert len(got) == len(b.ranks) and all(v == pytest.approx(per, rel=1e-3) for v in got.values())


@pytest.mark.parametrize("s", [0.5, 1.0, 2.0])
def test_zipf_skew_sets_the_hottest_receiver(s):
    cfg = step("mixtral-8x7b", tp=1, pp=1, dp=4, ep=4, n=4, layers=1, micro_batches=1, skew=f"zipf:{s}")
    b = build_step(cfg, list(range(4)))
    got = Counter()
    for t in b.transfers:
        if t.phase == "ep" and t.id < 10 ** 9:
            got[t.dst] += t.nbytes
    loads = tm.rank_loads(tm.skew_weights(f"zipf:{s}", 8), 4)
    # dispatch receivers get 3 x their load, combine receivers (1 - own) x each other's loads
    recv = {j: 2 * 3 * loads[j] + 2 * sum(loads[i] for i in range(4) if i != j) for j in range(4)}
    hottest = max(range(4), key=lambda j: recv[j])
    assert max(got, key=got.get) == hottest == 0
    mean = sum(got.values()) / 4
    assert got[0] / mean == pytest.approx(recv[0] / (sum(recv.values()) / 4), rel=1e-3)


def test_one_f_one_b_order_and_bubble():
    assert one_f_one_b(0, 4, 4) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("B", 1), ("B", 2), ("B", 3)]
    assert one_f_one_b(3, 4, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert train_run.bubble(step(tp=2, pp=4, dp=2, micro_batches=8)) == pytest.approx(3 / 11)


def test_dependencies_arrive_at_the_sender_and_compute_gaps_are_there():
    b = build_step(step(tp=2, pp=2, dp=4, micro_batches=3), list(range(16)))
    by_id = {t.id: t for t in b.transfers}
    assert len(by_id) == len(b.transfers)
    for t in b.transfers:
        assert all(by_id[d].dst == t.src for d in t.after)
    assert sum(t.delay for t in b.transfers if t.src == 0) == pytest.approx(b.compute_total[0])
    assert b.compute_total[0] > 0


def test_compute_time_from_flops_peak_and_mfu():
    cfg = step(tp=2, pp=1, dp=8, peak_flops=1e15, mfu=0.5)
    flops = 2 * cfg.model.attention_params * 4096 / 2
    assert cfg.compute_s(cfg.model.attention_params) == pytest.approx(flops / 5e14 * 4)


def test_placement_moves_the_wan_bytes_by_the_formula():
    plan = compile_plan(load_topology(ROOT / "topologies/ai-cluster.yml", ["zones=2"]))
    nodes = gpu_ranks(plan)
    wan = {}
    for pl in (("tp", "pp", "dp"), ("tp", "dp", "pp")):
        cfg = step(tp=2, pp=2, dp=4, placement=pl, dp_shard=2)
        s, _ = train_run.step_schedule(cfg, list(nodes), sch.DEFAULT_SLICE)
        wan[pl] = fabrics.expected(plan, nodes, s.transfers)["scaleacross"]
    m = step().model
    dp_wan = 16 * (m.params_per_layer * 2 / 2 * 2 * 1e-3) / 2          # every rank sends its half shard
    pp_wan = 2 * 4 * 4 * 4096 * 4096 * 2 * 1e-3                        # 2 ways x mb x dp x b*s*h
    assert wan[("tp", "pp", "dp")] == pytest.approx(dp_wan, rel=1e-3)
    assert wan[("tp", "dp", "pp")] == pytest.approx(pp_wan, rel=1e-3)


def test_degrees_must_multiply_to_the_participants():
    with pytest.raises(ValueError, match="= 8, but there are 16"):
        tm.degrees(16, 2, 2, 2)
    assert tm.degrees(16, 2, 2).dp == 4


def test_mixtral_preset_is_46b():
    assert tm.transformer("mixtral-8x7b").params == pytest.approx(46.4e9, rel=0.01)
    assert tm.transformer("llama-7b").params == pytest.approx(6.48e9, rel=0.01)


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_train_workload_gives_located_error(path):
    head = path.read_text().splitlines()[:2]
    line = int(re.match(r"# expect-line: (\d+)", head[0]).group(1))
    text = re.match(r"# expect: (.*)", head[1]).group(1)
    with pytest.raises(InputError) as info:
        load_workload(path)
    assert text in str(info.value) and str(path) in str(info.value)
    assert info.value.where.line == line, str(info.value)


@pytest.mark.parametrize("model,degrees,placement", [
    ("llama-7b", (2, 2, 4, 1), ("tp", "pp", "dp")), ("llama-7b", (2, 2, 4, 1), ("tp", "dp", "pp")),
    ("mixtral-8x7b", (2, 1, 8, 2), ("tp", "pp", "dp"))])
def test_the_estimate_gives_the_labs_bytes_per_fabric_and_dimension(model, degrees, placement):
    """Where both run, `labctl estimate`'s walk over the groups and the lab's schedule agree (0.1%)."""
    from labctl.estimate import train as et
    plan = compile_plan(load_topology(ROOT / "topologies/ai-cluster.yml", ["zones=2"]))
    nodes = gpu_ranks(plan)
    tp, pp, dp, ep = degrees
    cfg = step(model, tp=tp, pp=pp, dp=dp, ep=ep, placement=placement, layers=2 if ep > 1 else 4, dp_shard=2,
               skew="zipf:1" if ep > 1 else "uniform")
    s, _ = train_run.step_schedule(cfg, list(nodes), sch.DEFAULT_SLICE)
    dims, fab = et.step_bytes(cfg, et.lab_cluster(plan, list(nodes)))
    lab_fab = fabrics.expected(plan, nodes, s.transfers)
    for f in fabrics.FABRICS:
        assert fab[f] == pytest.approx(lab_fab[f], rel=1e-3, abs=64), f
    for d, v in train_run.dim_bytes(s).items():
        assert dims[d] == pytest.approx(v, rel=1e-3, abs=64), d


def test_the_model_puts_the_step_on_its_compute_path_when_the_network_is_free():
    from labctl.estimate import train as et
    cfg = step(tp=2, pp=4, dp=2, micro_batches=8)
    free = et.Cluster(16, 8, 16, dict.fromkeys(("scaleup", "scaleout", "scaleacross"), 1e18),
                      dict.fromkeys(("scaleup", "scaleout", "scaleacross"), 0.0))
    t = et.step_time(cfg, free)
    assert t["step_s"] == pytest.approx(t["compute_path_s"], rel=1e-6)      # (m + pp - 1)(f + b)
    slow = et.Cluster(16, 8, 16, free.Bps, {"scaleup": 0.0, "scaleout": 0.0, "scaleacross": 0.0}, 1e18, 1e-3)
    assert et.step_time(cfg, slow)["step_s"] > t["step_s"]


def test_estimate_cli_takes_a_train_workload(state_dir):
    from click.testing import CliRunner
    from labctl.cli import cli
    r = CliRunner().invoke(cli, ["estimate", "--train", str(ROOT / "workloads/train-llama7b.yml"), "--gpus", "8192",
                                 "--zones", "2", "--json"])
    assert r.exit_code == 0, r.output
    import json
    doc = json.loads(r.output)
    assert doc["degrees"]["dp"] == 2048 and doc["fabric_bytes"]["scaleacross"] > 0
    assert doc["time"]["step_s"] > doc["time"]["compute_path_s"] > 0


def test_degrees_that_miss_the_labs_participants_are_a_located_error(tmp_path):
    from labctl.traffic.run import build_ops, participants
    plan = compile_plan(load_topology(ROOT / "topologies/ai-cluster.yml", ["zones=2"]))
    wf = tmp_path / "w.yml"
    wf.write_text("name: w\ntrain:\n  model: llama-7b\n  layers: 4\n  degrees: {tp: 2, pp: 2, dp: 2}\n")
    loaded = load_workload(wf)
    with pytest.raises(InputError) as info:
        build_ops(plan, loaded, participants(plan, loaded))
    assert "= 8, but there are 16 participants" in str(info.value) and info.value.where.line == 5
