"""Random mutations of the bundled labs, workloads and experiments: every input either loads or
fails with a located error, never a traceback; and an `up` of a broken lab leaves nothing behind."""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import lab_namespaces, require_root
from labctl.errors import LabError
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology, render_topology

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yml")) + [ROOT / "tests/golden/dual-homed.yml",
                                                             ROOT / "tests/topologies/chain.yml"]
WORKLOADS = sorted((ROOT / "workloads").glob("*.yml"))
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yml"))

# values a careless or hostile file might hold where something else belongs
NASTY = [None, True, 0, -1, 2**64, 10**400, 1e308, float("inf"), float("-inf"), float("nan"), "", "..",
         "../../etc", "/", "1e999G", ".inf", "0x10", "400G", "9000", "-5ms", "1e15s", "{{ 7*7 }}", "a: b",
         "- x", "*x", "&x", "{{ cycler.__init__.__globals__ }}", "10.0.0.0/32", "127.0.0.0/8", "224.0.0.0/4",
         "😀", "x" * 300, "leaf1", "srv1-gpu0:nic0", "backend", "gpu", "switch", [], {}, [1, [2, [3]]],
         {"k": {"k": {"k": 1}}}, ["a", "b", "c"]]


def _paths(doc, prefix=()):
    """Every (path, value) in a nested document."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    cur = doc
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return doc


@st.composite
def mutated(draw, data: dict):
    """`data` with a few values replaced, keys removed or added, anywhere in it with equal chance
    (hypothesis's own choices lean towards the first few; a seeded Random does not)."""
    rnd = draw(st.randoms(use_true_random=False))
    doc = copy.deepcopy(data)
    for _ in range(rnd.randint(1, 3)):
        path, value = rnd.choice(list(_paths(doc)))
        action = rnd.choice(["replace", "replace", "delete", "add"])
        nasty = copy.deepcopy(rnd.choice(NASTY))         # never one object in two places
        if action == "replace" or not path:
            doc = _set(doc, path, nasty)
        elif action == "delete":
            parent = doc
            for p in path[:-1]:
                parent = parent[p]
            del parent[path[-1]]
        elif isinstance(value, dict):
            value[rnd.choice(["name", "kind", "rate", "zzz", "template", "vars", "links", "rank"])] = nasty
        elif isinstance(value, list):
            value.append(nasty)
        else:
            doc = _set(doc, path, nasty)
    return doc


@st.composite
def text_mutated(draw, text: str):
    """Character-level damage: a character deleted, inserted or doubled."""
    rnd = draw(st.randoms(use_true_random=False))
    chars = list(text)
    for _ in range(rnd.randint(1, 4)):
        i = rnd.randrange(max(1, len(chars)))
        op = rnd.choice(["del", "ins", "dup"])
        if op == "del" and chars:
            del chars[i]
        elif op == "ins":
            chars.insert(i, rnd.choice(list(":-[]{}&*!|>'\"#%@`\t\n ,?\\\xff")))
        elif chars:
            chars.insert(i, chars[i])
    return "".join(chars)


def _must_load_or_refuse(path: Path) -> None:
    try:
        compile_plan(load_topology(path))
    except LabError as exc:          # InputError included: a located, user-facing error
        assert str(exc)


def _rendered(path: Path) -> dict:
    return yaml.safe_load(render_topology(path)[0])


FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("source", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_mutated_topologies_load_or_fail_with_an_error(source, tmp_path, state_dir):
    full = _rendered(source)
    raw = yaml.safe_load(source.read_text())

    @FUZZ
    @given(st.one_of(mutated(full), mutated(raw)))
    def check(doc):
        f = tmp_path / "lab.yml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        _must_load_or_refuse(f)

    check()
    assert not state_dir.exists()      # loading and planning write nothing


@pytest.mark.parametrize("source", TOPOLOGIES[:3], ids=[p.stem for p in TOPOLOGIES[:3]])
def test_damaged_topology_text_loads_or_fails_with_an_error(source, tmp_path, state_dir):
    text = render_topology(source)[0]

    @FUZZ
    @given(text_mutated(text))
    def check(damaged):
        f = tmp_path / "lab.yml"
        f.write_text(damaged)
        _must_load_or_refuse(f)

    check()


@pytest.mark.parametrize("source", WORKLOADS, ids=[p.stem for p in WORKLOADS])
def test_mutated_workloads_load_or_fail_with_an_error(source, tmp_path):
    from labctl.traffic.run import build_ops, participants
    from labctl.traffic.workload import load_workload
    plan = compile_plan(load_topology(ROOT / ("topologies/ai-cluster.yml" if "checkpoint" in source.stem
                                              else "topologies/leaf-spine.yml")))
    raw = yaml.safe_load(source.read_text())

    @settings(max_examples=40, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutated(raw))
    def check(doc):
        f = tmp_path / "w.yml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        try:
            loaded = load_workload(f)
            if loaded.workload.collective or loaded.workload.fsdp:
                ranks = participants(plan, loaded)
                if sum(len(op.schedule.transfers) for op in build_ops(plan, loaded, ranks)[:1]) > 200_000:
                    return
        except LabError as exc:
            assert str(exc)

    check()


@pytest.mark.parametrize("source", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_mutated_experiments_are_refused_before_anything_is_built(source, tmp_path):
    from labctl.experiment.run import prepare
    raw = yaml.safe_load(source.read_text())

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutated(raw))
    def check(doc):
        f = source.parent / f".fuzz-{os.getpid()}.yml"   # beside the original: its paths are relative
        try:
            f.write_text(yaml.safe_dump(doc, allow_unicode=True))
            prepare(f, tmp_path / "out")
        except LabError as exc:
            assert str(exc)
        finally:
            f.unlink(missing_ok=True)

    check()


@pytest.mark.netns
def test_up_of_broken_labs_leaves_nothing_behind(tmp_path, state_dir, lab_name):
    """Through `up` as root: a broken lab is refused before anything exists, a good one is torn down."""
    require_root()
    from labctl import lifecycle as labmod
    source = _rendered(ROOT / "tests/topologies/chain.yml")
    before = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    built = refused = 0

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutated(source))
    def check(doc):
        nonlocal built, refused
        f = tmp_path / "lab.yml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        try:
            labmod.up(str(f), name=lab_name)
        except LabError:
            refused += 1
        else:
            built += 1
            labmod.down(lab_name)
        assert not lab_namespaces(lab_name + "-")
        assert not (state_dir / lab_name).exists()

    check()
    after = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    assert after <= before | set(), after - before
    assert refused > 0
