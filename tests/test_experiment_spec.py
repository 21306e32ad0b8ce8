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


def test_judge_takes_a_runs_share_of_the_way_between_two_others(tmp_path):
    exp = Experiment.model_validate({
        "name": "t", "topology": "x.yml", "steps": [{"run": "w.yml", "as": r} for r in ("ecmp", "qp4", "spray")],
        "expect": [{"run": "qp4", "metric": "time_s", "op": ">=", "value": 0.5,
                    "share_of": {"from": "ecmp", "to": "spray"}},
                   {"run": "qp4", "metric": "time_s", "op": ">", "value": 0.6,
                    "share_of": {"from": "ecmp", "to": "spray"}}]})
    got = judge(exp, {"ecmp": {"time_s": 4.5}, "qp4": {"time_s": 3.4}, "spray": {"time_s": 2.3}})
    assert [c["passed"] for c in got] == [True, False]
    assert got[0]["measured"].startswith("share of time_s of qp4 = 0.5 >= 0.5 (the share of the way from ecmp's 4.5")
    with pytest.raises(ValueError, match="share_of: compares the share with value"):
        Experiment.model_validate({"name": "t", "topology": "x.yml", "steps": [{"wait": "1s"}],
                                   "expect": [{"run": "a", "metric": "time_s", "op": ">", "than": {"run": "b"},
                                               "share_of": {"from": "a", "to": "b"}}]})


def test_the_figure_names_metrics_and_the_report_opens_with_answer_and_figure(tmp_path):
    import yaml
    from labctl.experiment.report import write_report
    f = tmp_path / "e.yml"
    f.write_text(yaml.safe_dump({"name": "t", "topology": str(ROOT / "topologies" / "leaf-spine.yml"),
                                 "steps": [{"wait": "1s"}], "figure": ["time_s", "speed"]}))
    with pytest.raises(InputError, match="unknown metric 'speed'") as info:
        prepare(f, tmp_path / "out")
    assert info.value.where.line == 3 and info.value.where.key == "figure[1]"      # its second item
    exp = Experiment.model_validate({"name": "t", "topology": "x", "steps": [{"wait": "1s"}], "figure": ["time_s"],
                                     "description": "why"})
    (tmp_path / "experiment.yml").write_text("name: t\n")
    doc = {"description": "why", "metrics": {"a": {"time_s": 1.0}}, "expectations": [], "plots": {},
           "captures": [], "summary_plot": "summary.png", "notes": {"a": ["ECMP put ring hops on one link"]}}
    text = write_report(tmp_path, exp, doc).read_text()
    assert text.split("\n## ")[1].startswith("Answer\n\n**") and "![summary](summary.png)" in text.split("\n## ")[1]
    assert "## The question\n\nwhy" in text and "- **a**: ECMP put ring hops on one link" in text
