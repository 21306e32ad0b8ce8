"""Random mutations of every bundled input: labs, template variables, containerlab files,
workloads and experiments. Every input either loads or fails with a located error, never a
traceback and never a hang of more than 5 s; and an `up` of a broken lab leaves nothing behind.

Seeded (derandomized), so a CI run tries the same inputs each time: see INPUTS_PER_RUN, which
docs/security.md quotes. Nothing is written into the source tree."""
from __future__ import annotations

import contextlib
import copy
import os
import signal
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
CLAB_FILES = sorted((ROOT / "tests" / "clab").rglob("*.clab.yml"))
TEMPLATES = sorted(p.parent.name for p in (ROOT / "templates").glob("*/vars.yml"))
HANG_S = 5
EXAMPLES = {"topology": 60, "text": 60, "clab": 40, "template": 80, "workload": 40, "experiment": 30}


@contextlib.contextmanager
def within(seconds: int = HANG_S):
    """Fail a case that spends more than `seconds` of CPU loading or refusing one input (a hang is
    a defect like a traceback). CPU time, not wall time: a host busy with other work slows a case
    without making it hang."""
    def hung(signum, frame):
        raise AssertionError(f"an input took more than {seconds} s of CPU to load or refuse")
    old = signal.signal(signal.SIGPROF, hung)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


# values a careless or hostile file might hold where something else belongs
NASTY = [None, True, 0, -1, 2**64, 10**400, 1e308, float("inf"), float("-inf"), float("nan"), "", "..",
         "../../etc", "/", "1e999G", ".inf", "0x10", "400G", "9000", "-5ms", "1e15s", "{{ 7*7 }}", "a: b",
         "- x", "*x", "&x", "{{ cycler.__init__.__globals__ }}", "10.0.0.0/32", "127.0.0.0/8", "224.0.0.0/4",
         "😀", "x" * 300, "leaf1", "srv1-gpu0:nic0", "backend", "gpu", "switch", [], {}, [1, [2, [3]]],
         {"k": {"k": {"k": 1}}}, ["a", "b", "c"], 1e30, "NaN", "/var/run/docker.sock:/s", "/:/host"]


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


def _must_load_or_refuse(path: Path, maps=None) -> None:
    try:
        with within():
            compile_plan(load_topology(path, maps=maps))
    except LabError as exc:          # InputError included: a located, user-facing error
        assert str(exc)


def _rendered(path: Path) -> dict:
    return yaml.safe_load(render_topology(path)[0])


FUZZ = settings(max_examples=EXAMPLES["topology"], deadline=None, derandomize=True,
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
    plan = compile_plan(load_topology(ROOT / ("topologies/ai-cluster.yml" if "checkpoint" in source.stem
                                              else "topologies/leaf-spine.yml")))
    raw = yaml.safe_load(source.read_text())

    @settings(max_examples=EXAMPLES["workload"], deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutated(raw))
    def check(doc):
        f = tmp_path / "w.yml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        try:
            with within():
                _plan_workload(f, plan)
        except LabError as exc:
            assert str(exc)

    check()


def _plan_workload(f: Path, plan) -> None:
    """Load a workload and build its first operation's schedule, as `labctl run` does before it sends."""
    from labctl.traffic.run import build_ops, participants
    from labctl.traffic.workload import load_workload
    loaded = load_workload(f)
    if loaded.workload.collective or loaded.workload.fsdp:
        build_ops(plan, loaded, participants(plan, loaded))[:1]


@pytest.mark.parametrize("source", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_mutated_experiments_are_refused_before_anything_is_built(source, tmp_path):
    from labctl.experiment.run import prepare
    raw = _absolute_paths(yaml.safe_load(source.read_text()), source.parent)

    @settings(max_examples=EXAMPLES["experiment"], deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutated(raw))
    def check(doc):
        f = tmp_path / source.name          # never beside the original: tests write nothing into the tree
        try:
            f.write_text(yaml.safe_dump(doc, allow_unicode=True))
            with within():
                prepare(f, tmp_path / "out")
        except LabError as exc:
            assert str(exc)

    check()


def _absolute_paths(doc, base: Path):
    """An experiment's relative file names (topology:, run:) made absolute, so a copy elsewhere reads the same files."""
    if isinstance(doc, dict):
        return {k: (str((base / v).resolve()) if k in ("topology", "run") and isinstance(v, str) and v.endswith(".yml")
                    else _absolute_paths(v, base)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_absolute_paths(v, base) for v in doc]
    return doc


@pytest.mark.parametrize("source", CLAB_FILES, ids=[p.stem for p in CLAB_FILES])
def test_mutated_containerlab_files_load_or_fail_with_an_error(source, tmp_path):
    from labctl.topology.clabmaps import parse
    raw = yaml.safe_load(source.read_text())
    maps = parse(["nokia_srlinux=frr", "arista_ceos=linux"])

    @settings(max_examples=EXAMPLES["clab"], deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutated(raw))
    def check(doc):
        f = tmp_path / source.name
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        _must_load_or_refuse(f, maps)

    check()


@pytest.mark.parametrize("template", TEMPLATES)
def test_hostile_template_variables_load_or_fail_with_an_error(template, tmp_path):
    names = list((yaml.safe_load((ROOT / "templates" / template / "vars.yml").read_text()) or {}).keys())

    @settings(max_examples=EXAMPLES["template"], deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.randoms(use_true_random=False))
    def check(rnd):
        given_vars = {rnd.choice(names + ["zzz"]): copy.deepcopy(rnd.choice(NASTY)) for _ in range(rnd.randint(1, 3))}
        f = tmp_path / "lab.yml"
        f.write_text(yaml.safe_dump({"template": template, "vars": given_vars}, allow_unicode=True))
        _must_load_or_refuse(f)

    check()


def test_the_fuzz_tries_at_least_two_thousand_inputs_a_run():
    assert INPUTS_PER_RUN >= 2000, INPUTS_PER_RUN


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


INPUTS_PER_RUN = (EXAMPLES["topology"] * len(TOPOLOGIES) + EXAMPLES["text"] * 3 + EXAMPLES["clab"] * len(CLAB_FILES)
                  + EXAMPLES["template"] * len(TEMPLATES) + EXAMPLES["workload"] * len(WORKLOADS)
                  + EXAMPLES["experiment"] * len(EXPERIMENTS))
