"""Random mutations of every bundled input: labs, template variables, containerlab files,
workloads and experiments. Every input either loads or fails with a located error, never a
traceback and never a hang of more than 5 s; and an `up` of a broken lab leaves nothing behind.

Four kinds of damage: values replaced by hostile ones anywhere (mutated), values replaced by
plausible ones of the same type, names taken from elsewhere in the file (plausible: these get past
the schema into the checks behind it), characters deleted or inserted (text_mutated), and YAML's
own hostile forms written into the text (tokens: tags, merge keys, huge integers, bad dates, deep
nesting). Workloads are also checked as `labctl run` checks them against a lab's plan before it
sends anything (traffic.run.prepare), with hostile collectives, sizes and participants.

Seeded (derandomized), so a CI run tries the same inputs each time: see INPUTS_PER_RUN, which
docs/security.md quotes. The damage itself is in fuzzing.py. Nothing is written into the source
tree."""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TEST_PREFIX, lab_namespaces, require_root
from fuzzing import NASTY, edges, mutated, plausible, text_mutated, token_mutated, within
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
EXAMPLES = {"topology": 60, "text": 60, "clab": 40, "template": 80, "workload": 40, "experiment": 30,
            "plausible": 30, "tokens": 12, "plausible-other": 12, "template-edges": 60, "hostile-workload": 300}


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
    plan = _plan_for_workload(source)
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


BUILD_AT_MOST = 200_000     # transfers: a larger schedule (legitimate, and seconds to build) is checked, not built


def _plan_workload(f: Path, plan) -> None:
    """Load a workload and check it against the lab's plan as `labctl run` does before it sends
    (its ranks, every operation's schedule, its TCP flows)."""
    from labctl.traffic.pool import gpu_ranks
    from labctl.traffic.run import largest_op, prepare
    from labctl.traffic.workload import load_workload
    loaded = load_workload(f)
    prepare(plan, loaded, build=largest_op(loaded, len(gpu_ranks(plan))) <= BUILD_AT_MOST)


def _plan_for_workload(source: Path):
    name = "ai-cluster" if "checkpoint" in source.stem else "leaf-spine"
    return _PLANS.setdefault(name, compile_plan(load_topology(ROOT / f"topologies/{name}.yml")))


_PLANS: dict = {}


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


def _fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _refused_or_loaded(load) -> None:
    try:
        with within():
            load()
    except LabError as exc:          # InputError included: a located, user-facing error
        assert str(exc)


@pytest.mark.parametrize("source", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_plausibly_mutated_topologies_load_or_fail_with_an_error(source, tmp_path):
    full, raw = _rendered(source), yaml.safe_load(source.read_text())

    @_fuzz(EXAMPLES["plausible"])
    @given(st.one_of(plausible(full), plausible(raw)))
    def check(doc):
        f = tmp_path / "lab.yml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        _must_load_or_refuse(f)

    check()


def _all_inputs() -> list[tuple[str, Path]]:
    return ([("lab", p) for p in TOPOLOGIES] + [("clab", p) for p in CLAB_FILES]
            + [("workload", p) for p in WORKLOADS] + [("experiment", p) for p in EXPERIMENTS])


def _load_as(kind: str, f: Path, source: Path, tmp_path: Path) -> None:
    if kind == "lab":
        compile_plan(load_topology(f))
    elif kind == "clab":
        from labctl.topology.clabmaps import parse
        compile_plan(load_topology(f, maps=parse(["nokia_srlinux=frr", "arista_ceos=linux"])))
    elif kind == "workload":
        _plan_workload(f, _plan_for_workload(source))
    else:
        from labctl.experiment.run import prepare
        prepare(f, tmp_path / "out")


def _source_text(kind: str, source: Path) -> str:
    if kind != "experiment":
        return source.read_text()
    # an experiment's relative file names made absolute, so that the copy reads the same files
    return re.sub(r"^(\s*(?:- )?(?:topology|run): )(\.\./\S+\.yml)", lambda m: m.group(1) +
                  str((source.parent / m.group(2)).resolve()), source.read_text(), flags=re.M)


@pytest.mark.parametrize("kind,source", _all_inputs(), ids=[f"{k}-{p.stem}" for k, p in _all_inputs()])
def test_hostile_yaml_forms_in_every_input_are_located_errors(kind, source, tmp_path):
    """Tags (python/name, binary, custom), merge keys, integers past the digit limit in any base,
    impossible dates, NaN, undefined aliases and deep nesting, written into each bundled file."""
    text = _source_text(kind, source)

    @_fuzz(EXAMPLES["tokens"])
    @given(token_mutated(text))
    def check(damaged):
        f = tmp_path / source.name
        f.write_text(damaged)
        _refused_or_loaded(lambda: _load_as(kind, f, source, tmp_path))

    check()


@pytest.mark.parametrize("kind,source", _all_inputs()[len(TOPOLOGIES):],
                         ids=[f"{k}-{p.stem}" for k, p in _all_inputs()[len(TOPOLOGIES):]])
def test_plausibly_mutated_inputs_load_or_fail_with_an_error(kind, source, tmp_path):
    raw = yaml.safe_load(_source_text(kind, source))

    @_fuzz(EXAMPLES["plausible-other"])
    @given(plausible(raw))
    def check(doc):
        f = tmp_path / source.name
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        _refused_or_loaded(lambda: _load_as(kind, f, source, tmp_path))

    check()


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_variables_at_and_past_their_edges_load_or_fail_with_an_error(template, tmp_path):
    """One variable at a time (two with nothing but a bound between them could build a lab of
    thousands of nodes, whose plan alone takes longer than a case may), at and past its edges."""
    spec = (yaml.safe_load((ROOT / "templates" / template / "vars.yml").read_text()) or {}).get("vars") or {}
    cases = [(name, value) for name, var in spec.items() if isinstance(var, dict) for value in edges(var)]

    @_fuzz(EXAMPLES["template-edges"])
    @given(st.sampled_from(cases))
    def check(case):
        name, value = case
        f = tmp_path / "lab.yml"
        f.write_text(yaml.safe_dump({"template": template, "vars": {name: value}}, allow_unicode=True))
        _must_load_or_refuse(f)

    check()


HOSTILE_WORKLOAD = {
    "collective": ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "incast", "sendrecv",
                   "bogus", "", "ALL_REDUCE", 7, ["all_reduce"], None],
    "sizes": [0, "0", "0B", 1e30, "1e30", float("nan"), ".nan", "NaN", float("inf"), -1, "-1MB", "1e999G",
              [0], [1e30], [float("nan")], [1, 2**64], {"begin": 0, "end": 1}, {"begin": "1MB", "end": "1e30"},
              {"begin": 1, "end": 2**70, "factor": 1.0000001}, {"begin": 1, "end": 10, "factor": float("nan")},
              {"begin": "64MB", "end": "1MB"}, "64MB", "1KB", [1] * 500, None],
    "participants": ["all", ["nope"], ["srv9-gpu9"], ["srv1-gpu0"], ["srv1-gpu0", "srv1-gpu0"], "rail:99",
                     "rail:-1", "rail:x", [], ["leaf1"], ["spine1", "srv1-gpu0"], "none", 0, None],
    "root": ["nope", "srv1-gpu0", "leaf1", "srv2-gpu3", None],
    "iterations": [1, 0, -1, 10**9, float("nan"), None],
    "algorithm": ["ring", "tree", "hier", "auto", "x", None],
    "flows": [[{"src": "srv1-gpu0", "dst": "srv9-gpu9"}], [{"src": "nope", "dst": "srv1-gpu0", "bytes": "1e30"}],
              [{"src": "srv1-gpu0", "dst": "srv1-gpu0", "bytes": float("nan")}], [{}], None],
    "victim": [{"src": "srv1-gpu0", "dst": "nope"}, {"src": "srv1-gpu0", "dst": "srv2-gpu0", "size": 0}, None],
}


def test_hostile_workloads_are_refused_before_labctl_run_sends_anything(tmp_path):
    """What `labctl run` checks against the lab's plan before it starts an agent (traffic.run.prepare),
    on the bundled leaf-spine's plan: unknown collectives, sizes of 0, 1e30 and NaN, participants
    and roots that are not GPUs of the lab, flows between nodes that do not exist."""
    plan = _plan_for_workload(ROOT / "workloads/allreduce.yml")
    refused = []

    @_fuzz(EXAMPLES["hostile-workload"])
    @given(st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in HOSTILE_WORKLOAD.items()}))
    def check(fields):
        doc = {"name": "hostile", **{k: v for k, v in fields.items() if v is not None}}
        f = tmp_path / "w.yml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        try:
            with within():
                _plan_workload(f, plan)
        except LabError as exc:
            assert str(exc)
            refused.append(str(exc))

    check()
    assert refused


@pytest.mark.parametrize("doc,where", [
    ({"collective": "bogus", "sizes": "1MB"}, "collective"),
    ({"collective": "all_reduce", "sizes": 0}, "sizes"),
    ({"collective": "all_reduce", "sizes": 1e30}, "sizes"),
    ({"collective": "all_reduce", "sizes": float("nan")}, "sizes"),
    ({"collective": "all_reduce", "sizes": "1MB", "participants": ["srv1-gpu0", "srv9-gpu9"]}, "participants"),
])
def test_each_hostile_workload_field_gets_an_error_at_its_key(doc, where, tmp_path):
    from labctl.errors import InputError
    f = tmp_path / "w.yml"
    f.write_text(yaml.safe_dump({"name": "hostile", **doc}))
    with pytest.raises(InputError) as info:
        _plan_workload(f, _plan_for_workload(ROOT / "workloads/allreduce.yml"))
    assert info.value.where.file == str(f) and where in str(info.value.where), str(info.value)



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
    # another test's lab may come and go beside this one under xdist: every test names its labs
    # lt-something (conftest's lt + 6 hex, test_netns_vxlan's ltvx + 4 hex, lt-swarm...), never another way
    others = re.compile(rf"{TEST_PREFIX}[0-9a-z-]*-")
    made = {ns for ns in after - before if ns.startswith(lab_name + "-") or not others.match(ns)}
    assert not made, made
    assert refused > 0


INPUTS_PER_RUN = (EXAMPLES["topology"] * len(TOPOLOGIES) + EXAMPLES["text"] * 3 + EXAMPLES["clab"] * len(CLAB_FILES)
                  + EXAMPLES["template"] * len(TEMPLATES) + EXAMPLES["workload"] * len(WORKLOADS)
                  + EXAMPLES["experiment"] * len(EXPERIMENTS) + EXAMPLES["plausible"] * len(TOPOLOGIES)
                  + EXAMPLES["tokens"] * len(_all_inputs())
                  + EXAMPLES["plausible-other"] * (len(_all_inputs()) - len(TOPOLOGIES))
                  + EXAMPLES["template-edges"] * len(TEMPLATES) + EXAMPLES["hostile-workload"])
