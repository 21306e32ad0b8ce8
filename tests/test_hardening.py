"""Issue #31's medium and low findings, one test each: every test here failed on the code before
its fix (the finding it names is in its docstring) and passes after.

State paths, the lock, run directories, the prompt's history file and its child processes, the
engine's socket, interrupted claims, `env` and install.sh. The namespace findings (collisions
across labs, identities in the journal) build real labs: tests/test_netns_collisions.py."""
from __future__ import annotations

import ast
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_root
from labctl import procs, state
from labctl.errors import LabError

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


def plant(where: Path, package: str = "labctl") -> Path:
    """A package named `package` in `where` whose import writes a marker file: it must never run."""
    marker = where / f"planted-{package}-ran"
    pkg = where / package
    pkg.mkdir(parents=True, exist_ok=True)
    payload = f"open({str(marker)!r}, 'w').write('ran')\n"
    for name in ("__init__.py", "__main__.py", "net.py"):
        (pkg / name).write_text(payload)
    return marker


# -- every state path is checked (finding: lab_dir/find_lab skipped the owner and mode checks) ------

def _record(state_dir: Path, name: str, mode: int = 0o700) -> Path:
    state_dir.mkdir(mode=0o700, exist_ok=True)
    d = state_dir / name
    d.mkdir(mode=0o700)
    (d / "state.json").write_text(json.dumps({"lab": name, "status": "up", "backend": "netns"}))
    os.chmod(d, mode)
    return d


@pytest.mark.netns
@pytest.mark.parametrize("how", ["mode 777", "owned by nobody", "symlink"])
def test_as_root_a_lab_record_others_could_write_is_refused_by_every_lookup(state_dir, tmp_path, how):
    require_root()
    from labctl.lifecycle import find_lab
    if how == "symlink":
        state_dir.mkdir(mode=0o700)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        (state_dir / "ls").symlink_to(elsewhere)
    else:
        d = _record(state_dir, "ls", 0o777 if how == "mode 777" else 0o700)
        if how == "owned by nobody":
            os.chown(d, NOBODY, NOBODY)
    for lookup in (lambda: state.lab_dir("ls"), lambda: find_lab("ls"), state.all_labs):
        if how == "symlink" and lookup is state.all_labs:
            assert state.all_labs() == []          # a symlink in the state directory is not a record
            continue
        with pytest.raises(LabError, match="record"):
            lookup()


@pytest.mark.netns
def test_as_root_a_loose_state_directory_is_refused_by_lab_dir_too(tmp_path, monkeypatch):
    require_root()
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    monkeypatch.setenv("LABCTL_STATE_DIR", str(loose))
    with pytest.raises(LabError, match="chmod 700"):
        state.lab_dir("ls")


@pytest.mark.netns
@pytest.mark.parametrize("above", ["owned by nobody", "group-writable", "a link owned by nobody", "sticky"])
def test_as_root_a_state_directory_someone_else_could_swap_is_refused_before_anything_is_made(
        tmp_path, monkeypatch, above):
    """A state directory of root's, 0700, under a directory another user owns or may write (a
    `sudo -E` home's ~/.local/state): that user could rename it away and put a link to their own
    records in its place between root's check and its use. Refused, naming the directory, before
    anything is made there; a sticky directory (/tmp) is safe, as others cannot rename root's."""
    require_root()
    home = tmp_path / "home"
    home.mkdir()
    if above == "owned by nobody":
        os.chown(home, NOBODY, NOBODY)
    elif above == "group-writable":
        os.chmod(home, 0o775)
    elif above == "sticky":
        os.chmod(home, 0o1777)
    where = home
    if above == "a link owned by nobody":
        where = tmp_path / "link"
        where.symlink_to(home)
        os.lchown(where, NOBODY, NOBODY)
    root = where / ".local" / "state" / "labctl"
    monkeypatch.setenv("LABCTL_STATE_DIR", str(root))
    if above == "sticky":
        assert state.checked_root(create=True) == root and root.is_dir()
        return
    with pytest.raises(LabError, match="someone but root can change") as err:
        state.checked_root(create=True)
    assert str(where) in str(err.value) and "/var/lib/labctl" in err.value.fix
    assert not (home / ".local").exists()
    with pytest.raises(LabError, match="someone but root can change"):
        state.all_labs()


@pytest.mark.netns
def test_under_sudo_E_the_state_directory_is_roots_not_the_callers(tmp_path, monkeypatch):
    """`sudo -E` keeps the caller's $HOME and $XDG_STATE_HOME: root's records go to root's own
    home, as the prompt's history does."""
    require_root()
    import pwd
    monkeypatch.delenv("LABCTL_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("SUDO_UID", "1000")
    assert state.state_root() == Path(pwd.getpwuid(0).pw_dir) / ".local" / "state" / "labctl"
    monkeypatch.delenv("SUDO_UID")
    assert state.state_root() == tmp_path / "xdg" / "labctl"      # root's own session: its own choice


@pytest.mark.netns
def test_down_of_a_forged_record_kills_nothing(state_dir):
    """A journal planted by another user (a 0777 record) names a process with its true start time:
    `labctl down` refuses the record and the process lives."""
    require_root()
    victim = subprocess.Popen(["sleep", "60"])
    try:
        d = _record(state_dir, "forged", 0o777)
        (d / "journal").write_text(f"pid {procs.identity(victim.pid)}\n")
        r = subprocess.run([str(Path(sys.executable).parent / "labctl"), "down", "forged"], capture_output=True,
                           text=True, env={**os.environ, "LABCTL_STATE_DIR": str(state_dir)})
        assert r.returncode != 0 and "record" in r.stderr, r.stderr
        time.sleep(0.2)
        assert victim.poll() is None, "down killed a process named by a forged journal"
        assert d.exists()
    finally:
        victim.kill()
        victim.wait()


# -- up, down and clean are serialised (finding: two concurrent `up`s were not) -------------------

def test_the_state_lock_is_exclusive_names_its_holder_and_is_reentrant(state_dir):
    holder = subprocess.Popen([sys.executable, "-P", "-c", "import sys, time; sys.path.insert(0, %r)\n"
                               "from labctl import state\nwith state.lock('labctl up other'):\n"
                               "    print('held', flush=True); time.sleep(2)" % str(ROOT)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "LABCTL_STATE_DIR": str(state_dir)})
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(LabError, match=f"process {holder.pid}, labctl up other"):
            with state.lock("test", wait_s=0.3):
                pass
        with state.lock("test"):               # waits for the holder, then holds it
            assert time.monotonic() - t0 > 1.5, "held the lock while another process held it"
            with state.lock("nested"):         # an experiment's up inside a run: no deadlock
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_file_put_in_place_as_a_symlink_is_refused(state_dir, tmp_path):
    state_dir.mkdir(mode=0o700)
    target = tmp_path / "precious"
    target.write_text("keep")
    (state_dir / ".lock").symlink_to(target)
    with pytest.raises(LabError, match="symlink"):
        with state.lock("test"):
            pass
    assert target.read_text() == "keep"


def test_up_down_and_clean_take_the_lock():
    import importlib
    source = Path(importlib.import_module("labctl.lifecycle.build").__file__).read_text()
    for fn in ("def build(", "def down(", "def clean("):
        body = source[source.index(fn):].split("\ndef ", 1)[0]
        assert "state.lock(" in body, f"{fn} does not take the state lock"


# -- interrupted claims (finding: a failed early check left a "building" record; a half-written
#    claim blocked `clean`) ---------------------------------------------------------------------

@pytest.mark.netns
@pytest.mark.parametrize("left", [["state.tmp"], ["state.json"], []])
def test_clean_removes_a_claim_interrupted_before_its_first_record(state_dir, left):
    require_root()
    from labctl import lifecycle
    state_dir.mkdir(mode=0o700)
    d = state_dir / "ltcut"
    d.mkdir(mode=0o700)
    for name in left:
        (d / name).write_text('{"lab": "ltc')          # cut off mid-write
    results = lifecycle.clean()
    assert [r.lab for r in results] == ["ltcut"]
    assert not d.exists()


@pytest.mark.netns
def test_an_up_refused_by_an_early_check_leaves_no_record(state_dir, lab_name, tmp_path):
    """The backend refuses before it makes anything (here: one of the lab's namespace names is
    taken by something that is no lab's); the record goes with the refusal, so up works again."""
    require_root()
    from labctl import lifecycle
    lab = tmp_path / "chain.yml"
    lab.write_text((ROOT / "tests/topologies/chain.yml").read_text().replace("name: chain", f"name: {lab_name}"))
    subprocess.run(["ip", "netns", "add", f"{lab_name}-r1"], check=True)
    try:
        with pytest.raises(LabError, match="no lab labctl knows of made it") as info:
            lifecycle.up(str(lab))
        assert f"ip netns del {lab_name}-r1" in str(info.value)
        assert not (state_dir / lab_name).exists(), "the refused up left its record"
        assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count(lab_name) == 1
    finally:
        subprocess.run(["ip", "netns", "del", f"{lab_name}-r1"])
    lifecycle.up(str(lab))                           # nothing of the refused one stands in the way
    lifecycle.down(lab_name)


# -- run directories (finding: one owned by another user was accepted) ----------------------------

@pytest.mark.netns
def test_a_run_directory_of_another_user_or_writable_by_others_is_refused(tmp_path):
    require_root()
    from labctl.traffic.run import new_run_dir
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(LabError, match="belongs to uid 65534"):
        new_run_dir(theirs)
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(LabError, match="mode 777"):
        new_run_dir(loose)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LabError, match="not a directory"):
        new_run_dir(tmp_path / "link")
    assert not (tmp_path / "elsewhere").exists()
    made = new_run_dir(tmp_path / "runs" / "new")
    assert made.is_dir() and os.stat(made).st_uid == os.geteuid()
    # another user's symlink on the way (their cwd's runs/ -> a directory of root's): refused, and
    # nothing is made where it points
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (tmp_path / "cwd").mkdir()
    planted = tmp_path / "cwd" / "runs"
    planted.symlink_to(victim)
    os.lchown(planted, NOBODY, NOBODY)
    with pytest.raises(LabError, match="symlink of uid 65534"):
        new_run_dir(planted / "20261207-exp")
    assert list(victim.iterdir()) == []


@pytest.mark.netns
def test_a_run_or_export_directory_under_one_another_user_can_rename_is_refused(tmp_path, monkeypatch):
    """Red team: root made --out inside a directory of another user's, who renamed it away during
    the run and put a link in its place; root then wrote the experiment's own text where the link
    pointed (an authorized_keys file). `labctl export --out` wrote, and removed, through links."""
    require_root()
    from labctl.exports import clab
    from labctl.paths import new_run_dir
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    monkeypatch.delenv("SUDO_UID", raising=False)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(LabError, match="theirs belongs to uid 65534, who could move it") as err:
        new_run_dir(theirs / "runs" / "r1")
    assert "/var/tmp" in err.value.fix and not (theirs / "runs").exists()
    deep = theirs / "a"
    deep.mkdir(mode=0o755)                    # root's own directory, inside theirs: still renamable
    with pytest.raises(LabError, match="theirs belongs to uid 65534"):
        new_run_dir(deep / "r1")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(LabError, match="open is writable by others"):
        new_run_dir(open_dir / "r1")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)                  # as /tmp: no one renames root's entries in it
    assert new_run_dir(sticky / "r1").is_dir()
    monkeypatch.setenv("SUDO_UID", str(NOBODY))   # the admin who ran sudo: their own directory is theirs to use
    assert new_run_dir(theirs / "r2").is_dir()
    monkeypatch.delenv("SUDO_UID")
    # export: the directory is made new; a link in it is never written through or removed
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml", ["scale_up=false"]))
    victim = tmp_path / "victim"
    (victim / "labctl").mkdir(parents=True)
    (victim / "labctl" / "precious").write_text("keep")
    out = tmp_path / "export"
    out.mkdir(mode=0o755)
    (out / "labctl-agent").symlink_to(victim)
    with pytest.raises(LabError, match="is not empty"):
        clab.export_dir(plan, out)
    assert (victim / "labctl" / "precious").read_text() == "keep"
    with pytest.raises(LabError, match="theirs belongs to uid 65534"):
        clab.export_dir(plan, theirs / "export")
    assert clab.export_dir(plan, tmp_path / "new-export")[0].is_file()


@pytest.mark.netns
def test_a_capture_file_is_never_written_through_a_symlink_or_over_another_user_s_file(tmp_path):
    """root's dumpcap, given a name, followed a link planted in the user's directory."""
    require_root()
    from labctl.lifecycle.capture import open_output
    keep = tmp_path / "keep"
    keep.write_text("KEEP-ME")
    (tmp_path / "h1_h2.pcapng").symlink_to(keep)
    with pytest.raises(LabError, match="a symlink"):
        open_output(tmp_path / "h1_h2.pcapng")
    theirs = tmp_path / "theirs.pcapng"
    theirs.write_text("x")
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(LabError, match="owner uid 65534"):
        open_output(theirs)
    assert keep.read_text() == "KEEP-ME" and theirs.read_text() == "x"
    fd = open_output(tmp_path / "new.pcapng")
    os.close(fd)
    assert (tmp_path / "new.pcapng").stat().st_uid == os.geteuid()
    # a directory on the way that is another user's link, or that they may rename (red team: a
    # link to /root made root's capture a new file there)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (tmp_path / "caps").symlink_to(victim)
    os.lchown(tmp_path / "caps", NOBODY, NOBODY)
    with pytest.raises(LabError, match="symlink of uid 65534"):
        open_output(tmp_path / "caps" / "c.pcapng")
    theirs = tmp_path / "their-dir"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(LabError, match="belongs to uid 65534"):
        open_output(theirs / "c.pcapng")
    assert list(victim.iterdir()) == [] and list(theirs.iterdir()) == []


# -- the prompt's history file (finding: followed through a symlink, overwritten and chmodded) -----

def test_the_history_file_is_never_written_through_a_symlink_or_a_hard_link(tmp_path):
    from labctl.cli import prompt
    victim = tmp_path / "shadow"
    victim.write_text("root:secret\n")
    os.chmod(victim, 0o644)
    link = tmp_path / "sym_history"
    link.symlink_to(victim)
    hard = tmp_path / "hard_history"
    os.link(victim, hard)
    for path in (link, hard):
        prompt.write_history(path, ["pingall"])
        assert prompt.read_history(path) == []
    assert victim.read_text() == "root:secret\n" and (os.stat(victim).st_mode & 0o777) == 0o644
    own = tmp_path / "history"
    prompt.write_history(own, ["pingall", "route a b"])
    assert prompt.read_history(own) == ["pingall", "route a b"] and os.stat(own).st_mode & 0o777 == 0o600


@pytest.mark.netns
def test_a_history_file_of_another_user_is_left_alone(tmp_path):
    require_root()
    from labctl.cli import prompt
    theirs = tmp_path / "history"
    theirs.write_text("theirs\n")
    os.chown(theirs, NOBODY, NOBODY)
    prompt.write_history(theirs, ["pingall"])
    assert theirs.read_text() == "theirs\n" and prompt.read_history(theirs) == []


def test_the_history_file_is_the_running_users_not_homes(monkeypatch, tmp_path):
    """Under `sudo -E`, $HOME is the calling user's: root's history must not go there."""
    import pwd
    from labctl.cli import prompt
    monkeypatch.setenv("HOME", str(tmp_path))
    assert prompt.history_file() == Path(pwd.getpwuid(os.geteuid()).pw_dir) / ".labctl_history"


# -- processes labctl starts import nothing from the current directory (finding: labctl cli) --------

def test_the_prompts_commands_start_at_root_and_run_where_the_user_stands(tmp_path, monkeypatch):
    """`labctl cli`'s commands: python -P with cwd=/ (a planted labctl/ never runs), and then in
    the prompt's directory, so a relative file name means what it means at the prompt."""
    import cmd
    from labctl.cli.prompt import Prompt
    marker = plant(tmp_path)
    (tmp_path / "lab.yml").write_text((ROOT / "tests/topologies/chain.yml").read_text())
    monkeypatch.chdir(tmp_path)
    seen = {}
    real_run = subprocess.run

    def spy(argv, **kwargs):
        seen.update(argv=argv, cwd=kwargs.get("cwd"))
        return real_run(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    p = Prompt.__new__(Prompt)
    cmd.Cmd.__init__(p, stdout=io.StringIO())
    p.failed = False
    p._labctl(["render", "lab.yml"])
    assert seen["cwd"] == "/" and "-P" in seen["argv"], seen
    assert "name: chain" in p.stdout.getvalue() and not p.failed, p.stdout.getvalue()
    assert not marker.exists(), "the planted labctl/ ran"


def test_the_mininet_probe_imports_no_mininet_from_the_current_directory(tmp_path, monkeypatch):
    """`labctl doctor` and `up --backend mininet` ask the system Python whether it has Mininet:
    `python3 -c 'import mininet.net'` ran a mininet/ folder of the current directory, as root."""
    from labctl.backends import mininet
    marker = plant(tmp_path, "mininet")
    monkeypatch.chdir(tmp_path)
    mininet.available()
    assert not marker.exists(), "the planted mininet/ ran"


def test_every_python_labctl_starts_runs_with_dash_p_and_from_root():
    """Every subprocess of a Python interpreter in labctl/ passes -P and cwd="/" (an interpreter
    started without them imports from the directory the user stands in)."""
    wrong = []
    for path in (ROOT / "labctl").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("run", "Popen", "check_output", "call") and node.args):
                continue
            argv = ast.unparse(node.args[0])
            if not any(py in argv for py in ("sys.executable", "SYSTEM_PYTHON", "python")):
                continue
            cwd = next((ast.unparse(k.value) for k in node.keywords if k.arg == "cwd"), None)
            if "'-P'" not in argv or cwd != "'/'":
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {argv[:80]} cwd={cwd}")
    assert not wrong, "\n".join(wrong)


# -- the engine's socket (finding: removed when a ping was slow) ------------------------------------

@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    from labctl.containers import engine
    run = tmp_path / "run"
    monkeypatch.setattr(engine, "SOCKET", str(tmp_path / "docker.sock"))
    monkeypatch.setattr(engine, "RUN_DIR", run)
    monkeypatch.setattr(engine, "RECORD", run / "dockerd.json")
    monkeypatch.setattr(engine, "LOG", run / "dockerd.log")
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/bin/false" if name == "dockerd" else None)
    return engine


def test_a_slow_engine_keeps_its_socket(fake_engine):
    """Something listens on the socket but answers no ping (an engine busy starting): labctl starts
    no second dockerd and removes nothing."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(fake_engine.SOCKET)
    srv.listen(8)
    try:
        with pytest.raises(LabError, match="listens on"):
            fake_engine.start(auto=True)
        assert os.path.exists(fake_engine.SOCKET)
    finally:
        srv.close()


def test_a_socket_labctl_did_not_make_is_never_removed(fake_engine):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(fake_engine.SOCKET)
    dead.close()                                      # a stale socket: nothing listens
    with pytest.raises(LabError, match="labctl did not make it"):
        fake_engine.start(auto=True)
    assert os.path.exists(fake_engine.SOCKET)


def test_a_stale_socket_of_labctls_own_dead_dockerd_is_removed(fake_engine):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(fake_engine.SOCKET)
    dead.close()
    fake_engine._write_record({"pid": 1, "identity": "1:0", "auto": True, "socket": fake_engine._socket_identity()})
    with pytest.raises(LabError, match="dockerd exited"):   # /bin/false stands in for dockerd
        fake_engine.start(auto=True)
    assert not os.path.exists(fake_engine.SOCKET)


# -- `env` is not taken from PATH ------------------------------------------------------------------

def test_no_command_labctl_runs_is_a_bare_env():
    """A command line starting with "env" runs the first `env` on root's PATH; labctl names
    /usr/bin/env (containers/nodes.py: ENV)."""
    from labctl.containers import nodes
    assert nodes.ENV == "/usr/bin/env"
    wrong = []
    for path in (ROOT / "labctl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                    and node.elts[0].value == "env":
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, wrong


# -- install.sh (finding: it installed editable from a clone owned by another user) -----------------

def _install_copy(tmp_path: Path, owner: int, mode: int) -> Path:
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copy(ROOT / "install.sh", clone / "install.sh")
    os.chmod(clone, mode)
    if os.geteuid() == 0:
        os.chown(clone, owner, owner)
    return clone


@pytest.mark.netns
@pytest.mark.parametrize("owner,mode,why", [(NOBODY, 0o755, "owned by uid 65534"), (0, 0o777, "others may write it")])
def test_install_refuses_a_clone_that_is_not_roots_alone(tmp_path, owner, mode, why):
    require_root()
    os.chmod(tmp_path, 0o755)
    clone = _install_copy(tmp_path, owner, mode)
    # PYTHON=/nonexistent: were the check missing, install.sh would stop at its Python check, before
    # it creates or links anything
    env = {**os.environ, "PYTHON": "/nonexistent"}
    env.pop("LABCTL_INSTALL_ANY_OWNER", None)
    r = subprocess.run(["bash", str(clone / "install.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 1 and "refusing to install" in r.stderr and why in r.stderr, r.stderr
    assert "sudo git clone" in r.stderr and "LABCTL_INSTALL_ANY_OWNER=1" in r.stderr
    r = subprocess.run(["bash", str(clone / "install.sh")], capture_output=True, text=True, timeout=600,
                       env={**env, "LABCTL_INSTALL_ANY_OWNER": "1"})
    assert "refusing" not in r.stderr and "needs Python" in r.stderr, r.stderr
    assert not (clone / ".venv").exists()


# -- node file templates (finding: a symlink in the tree read a root-only file into `plan`) --------

def test_a_template_that_leads_out_of_its_tree_is_refused_not_read(tmp_path):
    from labctl.errors import InputError, Where
    from labctl.topology.templates import render_file
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET")
    tree = tmp_path / "lab"
    (tree / "lib").mkdir(parents=True)
    (tree / "leak.j2").symlink_to(secret)
    (tree / "lib" / "ok.j2").write_text("hello {{ name }}")
    (tree / "inc.j2").write_text("{% include 'leak.j2' %}")
    assert render_file(tree, "lib/ok.j2", {"name": "r1"}, Where("lab.yml")) == "hello r1"
    for name in ("leak.j2", "inc.j2"):
        with pytest.raises(InputError) as err:
            render_file(tree, name, {}, Where("lab.yml"))
        assert "leads out of the template tree" in str(err.value) and "TOPSECRET" not in str(err.value)


def test_a_template_that_renders_for_ever_is_stopped_with_a_located_error(tmp_path, monkeypatch):
    from labctl.errors import InputError, Where
    from labctl.topology import templates
    monkeypatch.setattr(templates, "RENDER_LIMIT_S", 0.5)
    (tmp_path / "spin.j2").write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    t0 = time.monotonic()
    with pytest.raises(InputError) as err:
        templates.render_file(tmp_path, "spin.j2", {}, Where("lab.yml", 7, "nodes.r1.files"))
    assert time.monotonic() - t0 < 5 and "still rendering after 0.5 s" in str(err.value)
    assert "lab.yml:7" in str(err.value)


@pytest.mark.netns
def test_an_experiment_names_only_files_its_author_could_read():
    """Red team: an experiment of another user's naming /etc/shadow as its topology: had root quote
    the file's first line (root's password hash) in its error."""
    require_root()
    import tempfile
    from labctl.errors import InputError
    from labctl.experiment.run import prepare
    base = Path(tempfile.mkdtemp(prefix="labctl-test-", dir="/tmp"))    # searchable by others, as /tmp is
    try:
        os.chmod(base, 0o755)
        secret = base / "secret.yml"
        secret.write_text("root:$6$hash:20228:0:99999:7:::\n")
        os.chmod(secret, 0o600)
        theirs = base / "mallory"
        theirs.mkdir()
        exp = theirs / "e.yml"
        exp.write_text(f"name: e\ntopology: {secret}\nsteps:\n  - wait: 1ms\n")
        os.chown(theirs, NOBODY, NOBODY)
        os.chown(exp, NOBODY, NOBODY)
        with pytest.raises(InputError) as err:
            prepare(exp, base / "out")
        assert "not a file the experiment's author (uid 65534) may read" in str(err.value)
        assert "hash" not in str(err.value) and err.value.where.line == 2
        os.chmod(secret, 0o644)                  # one they may read: read, and refused for what it is
        with pytest.raises(InputError) as err:
            prepare(exp, base / "out2")
        assert "author" not in str(err.value) and "root:" in str(err.value)
    finally:
        shutil.rmtree(base)
