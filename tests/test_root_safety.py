"""labctl runs as root: what it deletes, kills, renders, imports and writes must be its own.

Each test here reproduces a way root could be turned against the machine, and checks that it no
longer works (they failed before their fixes)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import lab_namespaces, require_root
from labctl import procs, state
from labctl.dataplane import control
from labctl.errors import InputError, LabError
from labctl.topology.load import render_topology

ROOT = Path(__file__).resolve().parents[1]
CHAIN = ROOT / "tests" / "topologies" / "chain.yml"


def labctl(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "labctl", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})})


# -- deleting: only labctl's own records ------------------------------------------------------------

@pytest.mark.netns
def test_down_of_a_path_or_dotdot_refuses_and_deletes_nothing(state_dir, tmp_path):
    require_root()
    victim = tmp_path / "some-directory"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    state_dir.mkdir(mode=0o700)
    (state_dir / "other").mkdir()                       # another lab's record beside it
    (state_dir / "other" / "state.json").write_text(json.dumps({"lab": "other", "status": "up"}))
    for target, cwd in ((str(victim), None), ("..", state_dir / "other"), ("/", None), (".", state_dir)):
        r = labctl("down", target, cwd=cwd)
        assert r.returncode != 0 and "neither a lab name nor a topology file" in r.stderr, (target, r.stderr)
    assert (victim / "precious").read_text() == "keep me"
    assert (state_dir / "other" / "state.json").exists()


def test_a_directory_without_this_labs_record_is_never_removed(state_dir):
    state_dir.mkdir(mode=0o700)
    d = state.LabDir("ls", state_dir / "ls")
    d.path.mkdir()
    (d.path / "state.json").write_text(json.dumps({"lab": "someone-else"}))
    with pytest.raises(LabError):
        d.remove()
    assert d.path.exists()
    outside = state.LabDir("ls", state_dir.parent)      # a record pointing outside the state directory
    with pytest.raises(LabError):
        outside.remove()
    assert state_dir.parent.exists()
    with pytest.raises(LabError):
        state.lab_dir("../x")


def test_journal_lines_naming_other_namespaces_are_ignored(state_dir):
    state_dir.mkdir(mode=0o700)
    lab = state.LabDir("ls", state_dir / "ls")
    lab.path.mkdir()
    for name in ("ls-leaf1", "other-leaf1", "../../etc", "ls-../x", "ls-ok.a"):
        lab.journal("netns", name)
    assert lab.namespaces() == ["ls-leaf1", "ls-ok.a"]


def test_a_plan_naming_a_foreign_namespace_is_refused(tmp_path):
    from labctl.plan.compile import compile_plan
    from labctl.plan.model import LabPlan
    from labctl.topology.load import load_topology
    doc = compile_plan(load_topology(CHAIN)).to_dict()
    doc["nodes"][0]["namespace"] = "../../../etc"
    with pytest.raises(ValueError, match="not one of lab"):
        LabPlan.from_dict(doc)


@pytest.mark.netns
def test_as_root_a_state_directory_others_can_write_is_refused(tmp_path):
    require_root()
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    r = labctl("status", env={"LABCTL_STATE_DIR": str(loose)})
    assert r.returncode == 1 and "chmod 700" in r.stderr, r.stderr
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    r = labctl("status", env={"LABCTL_STATE_DIR": str(theirs)})
    assert r.returncode == 1 and "owned by uid 65534" in r.stderr, r.stderr


# -- killing: only processes labctl started ------------------------------------------------------------

@pytest.mark.netns
def test_destroy_kills_only_the_processes_it_can_prove_it_started(state_dir):
    require_root()
    from labctl import backends
    state_dir.mkdir(mode=0o700)
    lab = state.LabDir("ltkill", state_dir / "ltkill")
    lab.path.mkdir()
    lab.write_state(lab="ltkill", status="up")
    stranger = subprocess.Popen(["sleep", "60"])          # a PID labctl never started
    reused = subprocess.Popen(["sleep", "60"])            # journaled with another start time: a reused PID
    ours = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["sleep", "60"])             # an agent whose end was journaled
    try:
        lab.journal("pid", str(stranger.pid))             # an old-style entry without a start time
        lab.journal("pid", f"{reused.pid}:{procs.start_time(reused.pid) - 1}")
        lab.journal("pid", procs.identity(ours.pid))
        lab.journal("pid", procs.identity(ended.pid))
        lab.journal("released-pid", procs.identity(ended.pid))
        backends.get("netns").destroy(lab)
        time.sleep(0.2)
        assert ours.poll() is not None
        assert stranger.poll() is None and reused.poll() is None and ended.poll() is None
    finally:
        for p in (stranger, reused, ours, ended):
            p.kill()
            p.wait()


# -- importing: never from the caller's directory ---------------------------------------------------

@pytest.mark.netns
def test_helpers_and_agents_never_import_labctl_from_the_callers_directory(state_dir, lab_name, tmp_path):
    require_root()
    trap = tmp_path / "trap"
    marker = tmp_path / "imported"
    for mod in ("labctl/__init__.py", "labctl/dataplane/__init__.py", "labctl/traffic/__init__.py"):
        (trap / mod).parent.mkdir(parents=True, exist_ok=True)
        (trap / mod).write_text(f"open({str(marker)!r}, 'w').write('planted code ran')\n")
    (trap / "labctl/dataplane/controller.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (trap / "labctl/traffic/agent.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (trap / "labctl/traffic/launcher.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    lab_file = tmp_path / "two.yml"
    lab_file.write_text(f"name: {lab_name}\ndilation: 4000\nnodes:\n  sw: {{kind: switch}}\n  g0: {{kind: gpu}}\n"
                        "  g1: {kind: gpu}\nlinks:\n  - endpoints: [g0, sw]\n  - endpoints: [g1, sw]\n")
    wl = tmp_path / "w.yml"
    wl.write_text("name: w\ncollective: all_reduce\nsizes: [64KB]\nparticipants: all\n")
    env = {"LABCTL_STATE_DIR": str(state_dir), "PYTHONPATH": ""}
    # the CLI itself is run as `python -m labctl` from the repository, as a user of a clone would
    up = subprocess.run([sys.executable, "-m", "labctl", "up", str(lab_file)], capture_output=True, text=True,
                        cwd=ROOT, env={**os.environ, **env})
    assert up.returncode == 0, up.stderr
    try:
        # helpers and agents are started from wherever the user stands: here, the planted tree
        r = subprocess.run([sys.executable, "-P", "-c", "import sys; sys.path.insert(0, %r); "
                            "from labctl.cli import main; sys.argv = ['labctl', 'run', %r, '--lab', %r, '--out', %r]; "
                            "main()" % (str(ROOT), str(wl), lab_name, str(tmp_path / "run"))],
                           capture_output=True, text=True, cwd=trap, env={**os.environ, **env})
        assert r.returncode == 0, r.stdout + r.stderr
        assert not marker.exists(), marker.read_text()
    finally:
        labctl("down", lab_name, env=env)
    assert not lab_namespaces(lab_name + "-")


# -- rendering: templates are data, not code -------------------------------------------------------

def _evil_lab(tmp_path: Path, body: str, template: str = "pwn") -> Path:
    t = tmp_path / "templates" / template
    t.mkdir(parents=True)
    (t / "topology.yml.j2").write_text(body)
    (t / "vars.yml").write_text("vars: {}\n")
    lab = tmp_path / "lab.yml"
    lab.write_text(f"name: ev\ntemplate: {template}\n")
    return lab


@pytest.mark.parametrize("expr", ["cycler.__init__.__globals__.os.popen('touch MARK').read()",
                                  "self.__init__.__globals__.__builtins__.__import__('os').system('touch MARK')",
                                  "().__class__.__base__.__subclasses__()",
                                  "lipsum.__globals__['os'].popen('touch MARK')"])
def test_a_template_that_tries_to_run_a_command_renders_nothing_and_runs_nothing(tmp_path, expr):
    mark = tmp_path / "MARK"
    lab = _evil_lab(tmp_path, "name: {{ name }}\ndescription: \"{{ " + expr.replace("MARK", str(mark)) + " }}\"\n"
                              "nodes: {a: {kind: host}}\n")
    with pytest.raises(InputError, match="sandbox forbids|undefined"):
        render_topology(lab)
    assert not mark.exists()


def test_a_lab_folders_lib_does_not_replace_the_bundled_macros(tmp_path):
    lib = tmp_path / "templates" / "lib"
    lib.mkdir(parents=True)
    (lib / "fabric.j2").write_text("{% macro backend_nodes(p, s, l, sv, g, r, zone=none) %}  planted: {}\n"
                                   "{% endmacro %}")
    lab = tmp_path / "sa.yml"
    lab.write_text((ROOT / "topologies" / "scale-across.yml").read_text())
    text, _, _ = render_topology(lab)
    assert "planted" not in text and "z1-spine1" in text


@pytest.mark.netns
def test_as_root_a_template_others_can_write_is_refused(tmp_path):
    require_root()
    lab = _evil_lab(tmp_path, "name: {{ name }}\nnodes: {a: {kind: host}}\n", template="open")
    os.chmod(tmp_path / "templates" / "open" / "topology.yml.j2", 0o666)
    with pytest.raises(InputError, match="can be written by group or others"):
        render_topology(lab)


def _string_variables() -> list[tuple[str, str]]:
    """(bundled topology, string variable without choices) for every template a topology uses."""
    import yaml
    out = []
    for topo in sorted((ROOT / "topologies").glob("*.yml")):
        name = (yaml.safe_load(topo.read_text()) or {}).get("template")
        if name:
            spec = yaml.safe_load((ROOT / "templates" / name / "vars.yml").read_text())["vars"]
            out += [(topo.name, v) for v, d in spec.items() if d.get("type") == "str" and "choices" not in d]
    return out


@pytest.mark.parametrize("topology,var", _string_variables())
def test_a_string_variable_cannot_add_keys_to_what_the_template_writes(topology, var):
    """Every string variable a bundled template takes (wan_buffer, fe_buffer, ...) is written as one
    quoted YAML scalar: a value with a comma and a colon adds no key to the lab (`loss:`, `encrypt:`)."""
    from labctl.topology.load import load_topology
    assert ("scale-across.yml", "wan_buffer") in _string_variables()      # the list is not empty
    sets = [f'{var}="1MB, loss: 0.4, encrypt: true"'] + (["zones=2"] if topology == "ai-cluster.yml" else [])
    try:
        text, _, _ = render_topology(ROOT / "topologies" / topology, sets)
    except InputError as exc:           # a template that checks the value itself (te: one of three)
        assert "1MB, loss: 0.4, encrypt: true" in str(exc), exc
        return
    assert "encrypt: true" not in text.replace('"1MB, loss: 0.4, encrypt: true"', "")   # one quoted value
    try:        # as a value it is refused where it is used, with its key (or unused: te_class without te)
        load_topology(ROOT / "topologies" / topology, sets)
    except InputError as exc:
        assert "1MB, loss: 0.4, encrypt: true" in str(exc) or var in str(exc), exc


# -- writing: secrets private, run directories new ------------------------------------------------

def test_esp_keys_are_private_and_never_written_through_a_symlink(tmp_path):
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from labctl.wan.keys import write_keys
    plan = compile_plan(load_topology(ROOT / "topologies" / "scale-across.yml", ["encrypt=true"]))
    write_keys(plan, tmp_path)
    for name in ("esp_sa", "esp-keys.json"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600, name
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "esp_sa").unlink()
    (tmp_path / "esp_sa").symlink_to(target)
    with pytest.raises(LabError, match="cannot write"):
        write_keys(plan, tmp_path)
    assert target.read_text() == ""


def test_a_run_directory_that_holds_files_is_refused(tmp_path):
    from labctl.traffic.run import new_run_dir
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text("{}")
    with pytest.raises(LabError, match="is not empty"):
        new_run_dir(tmp_path / "old")
    assert new_run_dir(tmp_path / "new").is_dir()


# -- the controller's file: checked, serialised, survived ---------------------------------------------

def test_bad_settings_are_refused_before_control_json_is_written(tmp_path):
    for bad in ({"pmax": 7.0}, {"kmin": -1}, {"ecn": "yes"}, {"xoff": float("inf")}, {"nonsense": 1}):
        with pytest.raises(ValueError):
            control.merge(tmp_path, {"leaf1:spine1:3": bad})
    assert not (tmp_path / control.FILE).exists()


def test_concurrent_writers_of_control_json_lose_no_change(tmp_path):
    def write(k: int):
        for j in range(25):
            control.merge(tmp_path, {f"n{k}:p{j}:3": {"kmin": 1000 + j}})

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    doc = json.loads((tmp_path / control.FILE).read_text())
    assert len(doc["ports"]) == 100 and doc["generation"] == 100


@pytest.mark.netns
def test_the_controller_survives_a_broken_control_file_and_status_says_so(built_lab, state_dir):
    require_root()
    from labctl import lifecycle as labmod
    plan = built_lab(ROOT / "tests" / "topologies" / "bottleneck.yml")
    lab = state.lab_dir(plan.lab)
    (lab.path / control.FILE).write_text('{"generation": 1, "ports": {"r1:h2:3": {"pmax": "lots"}}}')
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(h["errors"] for h in labmod.helpers(lab)):
        time.sleep(0.05)
    (controller,) = [h for h in labmod.helpers(lab) if h["helper"] == "controller"]
    assert controller["running"] and "control.json ignored" in controller["errors"][-1], controller
    # and it still obeys a good change afterwards
    gen = control.merge(lab.path, {"r1:h2:0": {}})
    assert control.wait_applied(lab.path, gen)
    os.kill(lab.read_state()["controller_pid"], 9)
    time.sleep(0.2)
    (controller,) = [h for h in labmod.helpers(lab) if h["helper"] == "controller"]
    assert not controller["running"] and "NOT RUNNING" in controller["note"]
