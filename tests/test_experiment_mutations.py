"""Acceptance for experiments checked whole: a misspelt target, port, class or metric in ANY bundled
experiment is a located InputError in under a second, before any namespace exists (no root)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from labctl.errors import InputError
from labctl.experiment.run import prepare

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted((ROOT / "experiments").glob("*.yml"))
NETNS = Path("/run/netns")


def names(doc: dict) -> list[tuple[tuple, str]]:
    """(key path, what it names) of every target, port, class and metric the experiment names."""
    out = []
    for k, c in enumerate(doc.get("captures") or []):
        out.append((("captures", k, "port"), "port"))
    for k, step in enumerate(doc["steps"]):
        if "tc" in step:
            out.append((("steps", k, "tc", "target"), "target"))
            if "class" in step["tc"]:
                out.append((("steps", k, "tc", "class"), "class"))
        if "link" in step:
            out.append((("steps", k, "link", next(iter(step["link"]))), "port"))
        if isinstance(step.get("run"), dict):
            run = step["run"]
            for i, _ in enumerate(run.get("participants") or []) if isinstance(run.get("participants"), list) else []:
                out.append((("steps", k, "run", "participants", i), "target"))
            if "victim" in run:
                out.append((("steps", k, "run", "victim", "from"), "target"))
    for k, e in enumerate(doc.get("expect") or []):
        out.append((("expect", k, "metric"), "metric"))
    return out


def mutated(doc: dict, key: tuple) -> dict:
    doc = yaml.safe_load(yaml.safe_dump(doc))
    holder = doc
    for part in key[:-1]:
        holder = holder[part]
    value = str(holder[key[-1]])
    node, sep, port = value.partition(":")
    holder[key[-1]] = f"{node}:{port}x" if sep and key[-1] != "target" else (
        f"{node}x{sep}{port}" if sep else value + "x")       # a misspelt name, one letter too many
    return doc


def absolute(doc: dict, base: Path) -> dict:
    doc["topology"] = str(base / doc["topology"])
    for step in doc["steps"]:
        if isinstance(step.get("run"), str):
            step["run"] = str(base / step["run"])
    return doc


CASES = [(p, key, what) for p in BUNDLED for key, what in names(yaml.safe_load(p.read_text()))]


def test_every_bundled_experiment_names_something_to_misspell():
    for path in BUNDLED:                      # each contributes at least one metric to mutate
        assert any(p == path for p, _, _ in CASES), path.name
    # no bundled experiment names a class (tc: class:); tests/bad-experiments/13 covers that rule
    assert {what for _, _, what in CASES} >= {"target", "port", "metric"}, \
        "the bundled experiments should between them name a target, a port and a metric"


@pytest.mark.parametrize("path,key,what", CASES, ids=[f"{p.stem}:{'.'.join(map(str, k))}" for p, k, _ in CASES])
def test_a_misspelt_name_is_a_located_error_in_under_a_second(path, key, what, tmp_path, monkeypatch):
    doc = absolute(mutated(yaml.safe_load(path.read_text()), key), path.parent)
    bad = tmp_path / path.name
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    # the experiment's labs get a prefix of this test's own: under test.sh another worker's labs
    # come and go in /run/netns meanwhile, so only namespaces with this prefix say what prepare made
    prefix = f"ltm{os.getpid()}-"
    monkeypatch.setenv("LABCTL_EXPERIMENT_PREFIX", prefix)
    start, cpu = time.monotonic(), time.process_time()
    with pytest.raises(InputError) as info:
        prepare(bad, tmp_path / "out")
    took, cpu = time.monotonic() - start, time.process_time() - cpu
    # about 25 ms on an idle 2-core host; the bound is on labctl's own CPU time, since real-time lab
    # helpers of netns tests running beside this one have held the wall clock past a second
    assert cpu < 1.0, f"{cpu:.2f} s of CPU ({took:.2f} s)"
    where = info.value.where
    assert where is not None and where.line is not None, str(info.value)
    assert where.file == str(bad), f"located in {where.file}, not the experiment: {info.value}"
    assert [ns for ns in (os.listdir(NETNS) if NETNS.is_dir() else []) if ns.startswith(prefix)] == []
