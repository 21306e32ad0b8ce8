"""train: input checks: Megatron's shape rules, degrees against the lab's participants (an
experiment's before its lab is built, `estimate --train`'s against --gpus), and fixes that say what
to write. None needs root: nothing is built."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from labctl.cli import cli
from labctl.errors import InputError
from labctl.experiment.run import prepare
from labctl.traffic import train_model as tm
from labctl.traffic.train_spec import Degrees, TrainSpec, located, step_for
from labctl.traffic.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"      # 8 GPUs


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_tp_must_divide_the_kv_head_groups_and_the_ffn_as_megatron_asks():
    seventy = tm.transformer("llama-70b")
    with pytest.raises(tm.ShapeError, match="tp 16 must divide the 8 kv_heads") as info:
        tm.check_shape(seventy, tm.Degrees(16, 1, 1))
    assert info.value.key == "degrees.tp" and info.value.fix.startswith("set tp to 1, 2, 4 or 8")
    tm.check_shape(seventy, tm.Degrees(8, 1, 1))
    with pytest.raises(tm.ShapeError, match="tp 16 must divide the 1000 ffn hidden size") as info:
        tm.check_shape(tm.transformer("llama-7b", ffn=1000), tm.Degrees(16, 1, 1))
    assert "set tp to 1, 2, 4 or 8" in info.value.fix and "ffn a multiple of 16" in info.value.fix
    with pytest.raises(tm.ShapeError, match="tp 3 must divide the 32 attention heads"):
        tm.check_shape(tm.transformer("llama-7b"), tm.Degrees(3, 1, 1))


def test_a_shape_error_is_located_at_the_degree_with_the_values_that_fit(tmp_path):
    f = write(tmp_path / "w.yml", "name: w\ntrain:\n  model: llama-70b\n  degrees:\n    pp: 2\n    tp: 16\n")
    with pytest.raises(InputError) as info:
        load_workload(f)
    assert info.value.where.line == 6 and info.value.where.key == "train.degrees.tp", str(info.value)
    assert "fix: set tp to 1, 2, 4 or 8 (what divides heads 64, kv_heads 8 and ffn 28672)" in str(info.value)


def test_divisors_read_as_a_list():
    assert [tm.divisors(n) for n in (1, 2, 8, 129)] == ["1", "1 or 2", "1, 2, 4 or 8", "1, 3, 43 or 129"]
    assert tm.divisors(4096) == "1, 2, 4, 8, 16, 32, 64, ... or 4096"


def test_dp_shard_that_the_derived_dp_breaks_is_reported_at_dp_shard_with_a_fix_that_helps(tmp_path):
    f = write(tmp_path / "llama70b.yml", "name: llama70b\ntrain:\n  model: llama-70b\n  degrees: {tp: 8, pp: 8}\n"
                                         "  dp_shard: 64\n")
    loaded = load_workload(f)
    with pytest.raises(InputError) as info:
        step_for(loaded.workload.train, 8256, 1.0, located(str(f), loaded.smap))
    e = info.value
    assert (e.where.line, e.where.key) == (5, "train.dp_shard"), str(e)
    assert e.message == "dp_shard 64 must divide dp 129 (= 8256 participants / tp x pp 64)"
    assert e.fix == ("set dp_shard to 1, 3, 43 or 129, or run on a multiple of tp x pp x dp_shard = 4,096 GPUs "
                     "(8,192 or 12,288) to keep dp_shard 64")
    assert step_for(loaded.workload.train, 8192, 1.0, located(str(f), loaded.smap)).degrees.dp == 128


def test_estimate_reports_the_dp_shard_rule_at_its_key(tmp_path):
    f = write(tmp_path / "llama70b.yml", "name: llama70b\ntrain:\n  model: llama-70b\n  degrees: {tp: 8, pp: 8}\n"
                                         "  dp_shard: 64\n")
    result = CliRunner().invoke(cli, ["estimate", "--train", str(f), "--gpus", "8256"])
    assert result.exit_code == 2, result.output
    assert f"{f}:5: train.dp_shard: dp_shard 64 must divide dp 129" in result.output
    assert "make tp x pp x dp equal" not in result.output


@pytest.mark.parametrize("degrees,n,key,text,fix", [
    ({"tp": 2, "pp": 2, "dp": 4}, 8, "train.degrees", "tp x pp x dp = 2 x 2 x 4 = 16, but there are 8 participants",
     "leave dp out (it is then 8 / 4 = 2), or choose degrees whose product is 8"),
    ({"tp": 3}, 8, "train.degrees", "tp x pp = 3 x 1 = 3 does not divide the 8 participants",
     "choose tp and pp whose product divides 8, or run on a multiple of 3 GPUs (6 or 9)"),
])
def test_degrees_that_do_not_fit_the_participants_say_what_would(degrees, n, key, text, fix):
    spec = TrainSpec(layers=4, hidden=4096, heads=48 if degrees["tp"] == 3 else 32, degrees=Degrees(**degrees))
    with pytest.raises(InputError) as info:
        step_for(spec, n, 1.0, located("w.yml", None))
    assert (info.value.where.key, info.value.message, info.value.fix) == (key, text, fix)


def experiment(tmp_path: Path, step: dict) -> Path:
    doc = {"name": "bad-exp2", "topology": str(LEAF_SPINE), "steps": [step]}
    return write(tmp_path / "bad-exp2.yml", yaml.safe_dump(doc, sort_keys=False))


def test_an_inline_train_step_that_does_not_fit_the_lab_fails_at_the_experiments_line_before_building(tmp_path):
    path = experiment(tmp_path, {"run": {"name": "b", "train": {"model": "llama-7b", "degrees":
                                                                 {"tp": 2, "pp": 2, "dp": 4}}}, "as": "b"})
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "degrees:" in t)
    with pytest.raises(InputError) as info:
        prepare(path, tmp_path / "out")          # compiles the lab's plan; builds nothing
    e = info.value
    assert (e.where.file, e.where.line) == (str(path), line), str(e)
    assert e.where.key == "steps[0].run.train.degrees"
    assert "tp x pp x dp = 2 x 2 x 4 = 16, but there are 8 participants" in e.message


def test_a_train_workload_file_that_does_not_fit_the_lab_fails_at_its_own_line(tmp_path):
    w = write(tmp_path / "t.yml", "name: t\ntrain:\n  model: llama-7b\n  layers: 4\n  degrees: {tp: 2, pp: 2, dp: 4}\n")
    path = experiment(tmp_path, {"run": "t.yml"})
    with pytest.raises(InputError) as info:
        prepare(path, tmp_path / "out")
    assert (info.value.where.file, info.value.where.line) == (str(w), 5), str(info.value)


def test_a_train_step_that_fits_the_lab_prepares(tmp_path):
    path = experiment(tmp_path, {"run": {"name": "ok", "train": {"model": "llama-7b", "layers": 4,
                                                                  "degrees": {"tp": 2, "pp": 2}}}})
    prepare(path, tmp_path / "out")


def bad_value(model, name):
    if model is TrainSpec and name == "degrees":
        return 3
    return {"not": "this"}


@pytest.mark.parametrize("model,name", [(TrainSpec, n) for n in TrainSpec.model_fields] +
                         [(Degrees, n) for n in Degrees.model_fields])
def test_every_train_keys_bad_value_gets_a_fix_that_says_what_to_write(model, name, tmp_path):
    train = {"model": "llama-7b"}
    if model is Degrees:
        train["degrees"] = {name: bad_value(model, name)}
    else:
        train[name] = bad_value(model, name)
    f = write(tmp_path / "w.yml", yaml.safe_dump({"name": "w", "train": train}))
    with pytest.raises(InputError) as info:
        load_workload(f)
    fix = info.value.fix
    assert info.value.where.key == "train." + ("degrees." if model is Degrees else "") + name, str(info.value)
    assert fix.startswith(f"{name} is the ") or fix.startswith(f"{name} is a "), fix
    assert f"write e.g. {name}: " in fix and "docs/parallelism.md" in fix and "README" not in fix


def test_run_help_names_train_workloads():
    out = CliRunner().invoke(cli, ["run", "--help"]).output
    assert "train:" in out and "docs/parallelism.md" in out
    assert "labctl run workloads/train-llama7b.yml" in out


def test_a_train_step_prints_as_a_step_not_as_an_nccl_tests_row():
    """A train: step printed as a collective row: 'float sum', algbw and busbw of a whole schedule."""
    from labctl.traffic import report
    step = {"label": "train step 0", "collective": "train_step", "size": 123456, "n": 8, "time_s": 1.2,
            "algbw_GBps": 0.1, "busbw_GBps": 0.1, "ideal_s": 1.0, "wrong": 0,
            "real": {"time_s": 0.0003, "algbw_GBps": 400.0, "busbw_GBps": 400.0}}
    train = {"degrees": {"tp": 2, "pp": 2, "dp": 2, "ep": 1}, "placement": ["tp", "pp", "dp"],
             "wan_hidden_fraction": None, "step_time_s": 1.2, "scale": 0.001, "ideal_s": 1.0,
             "compute_path_s": 0.5, "bubble_fraction": 0.2, "duty_cycle": 0.6, "dim_bytes": {"tp": 10},
             "fabric_bytes_expected": {"scaleup": 10}}
    doc = {"workload": "train", "lab": "ls", "ranks": list(range(8)), "dilation": 4000.0, "train": train,
           "results": [step, dict(step, label="train step 1", time_s=1.4)]}
    text = report.table(doc)
    assert "float" not in text and "busbw" not in text, text
    assert "# 2 train steps measured: 1.300 s lab on average (1.200-1.400), bound 1.000 s, ratio 1.30, " \
           "0 wrong" in text
    assert "# train step tp=2 pp=2 dp=2 ep=1" in text


def test_an_fsdp_stage_row_is_labelled_and_claims_no_bus_bandwidth():
    """User trial: FSDP's rows were unlabelled, 'float sum', with busbw = algbw for a mix of an
    all-gather and a reduce-scatter."""
    from labctl.traffic import report

    def row(label, collective, busbw):
        return {"label": label, "collective": collective, "size": 4096, "n": 8, "time_s": 0.01, "algbw_GBps": 0.4,
                "busbw_GBps": busbw, "ideal_s": 0.01, "wrong": 0,
                "real": {"time_s": 2.5e-6, "algbw_GBps": 1600.0, "busbw_GBps": busbw * 4000}}
    doc = {"workload": "w", "lab": "ls", "ranks": list(range(8)), "dilation": 4000.0,
           "results": [row("backward all_gather layer 0 + backward reduce_scatter layer 0", "fsdp_stage", 0.4),
                       row("ag", "all_gather", 0.35)]}
    lines = report.table(doc).splitlines()
    stage = next(x for x in lines if "backward all_gather layer 0 + backward reduce_scatter" in x)
    assert stage.split()[2:4] == ["-", "-"] and stage.split()[7] == "-", stage     # type, redop; busbw
    ag = next(x for x in lines if x.split()[:1] == ["4096"] and "backward" not in x)
    assert ag.split()[2:4] == ["float", "none"], ag
    assert any(x.startswith("# Avg bus bandwidth (lab): 0.3500 GB/s") for x in lines), lines


def test_tp_off_nvlink_blames_the_lab_when_it_has_no_nvlink_and_the_placement_when_it_has():
    """User trial: on ai-cluster (no NVLink) the note said the placement put tp on scale-out, which
    no placement could change."""
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from labctl.traffic import fabrics, report
    cluster = compile_plan(load_topology(ROOT / "topologies" / "ai-cluster.yml", ["zones=2"]))
    assert "scaleup" not in fabrics.present(cluster) and "scaleacross" in fabrics.present(cluster)
    assert "scaleup" in fabrics.present(compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", [])))
    by_dim = {"tp": {"scaleout": 100}}
    assert "this lab has no scaleup fabric" in report.dimension_lines(by_dim, fabrics.present(cluster))[1]
    assert "the placement put it there" in report.dimension_lines(by_dim, ["scaleup", "scaleout"])[1]
