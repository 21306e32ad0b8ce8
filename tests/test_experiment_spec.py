"""Experiment files: broken ones fail before anything is built; expectations are judged right."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from labctl.errors import InputError
from labctl.experiment.run import judge, prepare
from labctl.experiment.spec import Experiment

ROOT = Path(__file__).resolve().parents[1]
BAD = sorted((ROOT / "tests" / "bad-experiments").glob("*.yml"))


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_broken_experiment_fails_with_a_located_error_before_building(path, tmp_path):
    head = path.read_text().splitlines()[:2]
    line = int(re.match(r"# expect-line: (\d+)", head[0]).group(1))
    text = re.match(r"# expect: (.*)", head[1]).group(1)
    with pytest.raises(InputError) as info:
        prepare(path, tmp_path / "out")          # needs no root: nothing is built
    assert text in str(info.value), str(info.value)
    # an inline workload's error too is located in the experiment, not in the copy labctl writes of it
    assert info.value.where.line == line and info.value.where.file == str(path), str(info.value)


def test_every_bundled_experiment_is_valid(tmp_path):
    for path in sorted((ROOT / "experiments").glob("*.yml")):
        prepare(path, tmp_path / path.stem)


def test_run_set_overrides_the_experiments_lab_and_a_bad_one_names_its_origin(tmp_path):
    from labctl.experiment.run import _sets
    exp, _, _ = prepare(ROOT / "experiments" / "incast-pfc.yml", tmp_path / "ok", ["dilation=16000"])
    assert _sets(exp, None, ["dilation=16000"]) == ["scale_up=false", "dilation=16000"]
    with pytest.raises(InputError, match="from labctl run --set") as info:
        prepare(ROOT / "experiments" / "incast-pfc.yml", tmp_path / "bad", ["dilation=fast"])
    assert "dilation" in str(info.value)


def test_judge_compares_runs_factors_and_trends():
    exp = Experiment.model_validate({
        "name": "t", "topology": "x.yml", "sweep": {"var": "d", "values": [1, 2, 3]},
        "steps": [{"run": "w.yml", "as": "a"}, {"run": "w.yml", "as": "b"}],
        "expect": [{"run": "a", "metric": "time_s", "trend": "increasing"},
                   {"run": "b@3", "metric": "drops", "op": ">", "than": {"run": "a@3"}, "factor": 2},
                   {"run": "a", "metric": "drops", "op": "==", "value": 0}]})
    m = {f"{r}@{v}": {"time_s": t, "drops": d} for r, v, t, d in (
        ("a", 1, 1.0, 0), ("a", 2, 2.0, 0), ("a", 3, 1.5, 5), ("b", 1, 1, 0), ("b", 2, 1, 0), ("b", 3, 1, 11))}
    got = judge(exp, m)
    assert [c["passed"] for c in got] == [False, True, True, True, False]
    assert "1, 2, 1.5" in got[0]["measured"] and "2 x drops of a@3 (5) = 10" in got[1]["measured"]
