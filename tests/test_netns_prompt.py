"""`labctl cli LAB` as a person uses it: through a pseudo-terminal, typing commands (with Tab) and
reading the answers; and the same commands non-interactively with -c."""
from __future__ import annotations

import os
import pwd
import pty
import re
import select
import subprocess
import sys
import time

from pathlib import Path

import pytest

from conftest import lab_namespaces, require_root
from labctl import Lab, Topology

pytestmark = pytest.mark.netns


def lab_of(name: str) -> Topology:
    t = Topology(name, dilation=4000)
    t.add_switch("leaf")
    t.add_switch("spine")
    t.add_gpu("alpha")
    t.add_gpu("beta")
    t.add_link("alpha", "leaf", rate="400G")
    t.add_link("leaf", "spine", rate="400G")
    t.add_link("beta", "spine", rate="400G")
    return t


def _own_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty on its stdin, so
    that Ctrl-C typed there is SIGINT to its foreground group, as in a person's terminal. It starts
    with SIGINT ignored, as a shell's background job does (CI's parts run that way, and ci73 and
    ci74 failed so): the prompt must take Ctrl-C back itself."""
    import fcntl
    import signal
    import termios
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Terminal:
    """A process on a pseudo-terminal: type into it, wait for what it prints."""

    def __init__(self, argv: list[str], env: dict):
        self.fd, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
                                     preexec_fn=_own_terminal)
        os.close(slave)
        self.seen = ""

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def expect(self, pattern: str, timeout: float = 30) -> str:
        """Everything printed up to and including the first match of pattern (a regex)."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.seen)
            if m:
                out, self.seen = self.seen[:m.end()], self.seen[m.end():]
                return out
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[-1500:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    self.seen += os.read(self.fd, 65536).decode(errors="replace").replace("\r", "")
                except OSError:      # the other side closed
                    assert re.search(pattern, self.seen), f"no {pattern!r} in {self.seen[-1500:]!r}"

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=30)
        finally:
            os.close(self.fd)


PROMPT = r"labctl> "


@pytest.fixture
def root_history(lab_name):
    """The history is root's own ~/.labctl_history (from the password database, never $HOME, which
    sudo -E keeps): a real one is moved aside for the test and put back."""
    history = Path(pwd.getpwuid(os.geteuid()).pw_dir) / ".labctl_history"
    kept = history.with_name(f".labctl_history.kept-by-{lab_name}")
    if history.exists():
        history.rename(kept)
    try:
        yield history
    finally:
        history.unlink(missing_ok=True)
        if kept.exists():
            kept.rename(history)


def test_the_prompt_answers_what_is_typed(state_dir, lab_name, tmp_path, root_history):
    require_root()
    env = {**os.environ, "HOME": str(tmp_path), "LABCTL_STATE_DIR": str(state_dir), "TERM": "xterm"}
    _answers(env, lab_name, root_history)
    assert not (tmp_path / ".labctl_history").exists()      # $HOME (sudo -E's) is not where it goes


def _answers(env: dict, lab_name: str, history: Path) -> None:
    with Lab(lab_of(lab_name)) as lab:
        beta = lab.plan.node("beta").interfaces[0].address.split("/")[0]
        term = Terminal([sys.executable, "-m", "labctl", "cli", lab_name], env)
        try:
            assert "Type help" in term.expect(PROMPT)
            term.type("nodes\n")
            out = term.expect(PROMPT)
            assert "alpha(gpu)" in out and "leaf(switch)" in out
            # Tab completes a node name (alp -> alpha) and another one in the command (bet -> beta),
            # and the name becomes beta's address
            term.type("alp\t ping -c1 -W2 bet\t\n")
            out = term.expect(PROMPT)
            assert f"PING {beta}" in out and "1 received" in out, out
            term.type("pinga\t\n")
            assert "*** Results: 2/2 pairs reachable" in term.expect(PROMPT)
            term.type("route alpha beta 49152\n")
            assert re.search(r"alpha \(leaf\) -> leaf \(spine\) -> spine \(beta\) -> beta", term.expect(PROMPT))
            term.type("link leaf:spine down\n")
            assert "link leaf:spine is down" in term.expect(PROMPT)
            term.type("pingall\n")
            assert "*** Results: 0/2 pairs reachable" in term.expect(PROMPT)
            term.type("link leaf:spine up\n")
            term.expect(PROMPT)
            term.type("leaf ip -br link show spine\n")      # a port named like a node stays a port
            assert re.search(r"^spine@\S+\s+UP", term.expect(PROMPT), re.M)
            term.type("no-such-thing\n")
            assert "unknown command 'no-such-thing'" in term.expect(PROMPT)
            # a node's command prints as it runs, and Ctrl-C stops it, not the prompt (Mininet's way)
            term.type("alpha ping -i 0.2 beta\n")
            term.expect(r"bytes from .*\n.*bytes from")
            term.type("\x03")
            term.expect(PROMPT)
            # at the prompt's own line: a new line and the prompt again
            term.type("\x03")
            term.expect(PROMPT)
            term.type("nodes\n")
            assert "alpha(gpu)" in term.expect(PROMPT)
            # flow control held the terminal (Ctrl-S) while the prompt ticked: the echo of what was
            # typed meanwhile is shown once Ctrl-Q lets it go, not lost to an interrupted write
            term.type("\x13")
            time.sleep(0.2)
            term.type("nod")
            time.sleep(0.5)
            term.type("\x11")
            time.sleep(0.2)
            term.type("es\n")
            out = term.expect(PROMPT)
            assert re.search(r"^nodes$", out, re.M) and "alpha(gpu)" in out, out
            term.type("alpha ping -c1 beta | tail -1\n")       # no shell: said, not passed to ping
            assert "no shell runs a node's command here" in term.expect(PROMPT)
            term.type("exit\n")
            assert term.close() == 0
        finally:
            if term.proc.poll() is None:
                term.proc.kill()
        assert "pingall" in history.read_text() and oct(history.stat().st_mode & 0o777) == "0o600"
    assert lab_namespaces(lab_name + "-") == []


def test_ctrl_c_just_after_the_prompt_is_not_lost(state_dir, lab_name, tmp_path, root_history):
    """CPython's readline misses a Ctrl-C that lands after the prompt is printed and before it waits
    for a key (ci73, ci81: 30 s of nothing). strace holds each of the prompt's writes 0.2 s on its way
    back, so every Ctrl-C the test types on seeing the prompt lands in that window."""
    require_root()
    env = {**os.environ, "HOME": str(tmp_path), "LABCTL_STATE_DIR": str(state_dir), "TERM": "xterm"}
    import shutil
    import signal
    assert shutil.which("strace"), "strace is missing: ./install.sh installs it (apt-get install strace)"
    with Lab(lab_of(lab_name)):
        term = Terminal(["strace", "-o", "/dev/null", "-e", "trace=write", "-e", "inject=write:delay_exit=200000",
                         sys.executable, "-m", "labctl", "cli", lab_name], env)
        try:
            term.expect(PROMPT)
            for _ in range(3):
                term.type("\x03")
                term.expect(PROMPT, timeout=5)      # the tick is 0.1 s; the write held 0.2 s
            term.type("exit\n")
            assert term.close() == 0
        finally:
            if term.proc.poll() is None:
                # strace leads the session: its group holds the traced prompt too, which a kill
                # of strace alone would leave behind
                os.killpg(term.proc.pid, signal.SIGKILL)
                term.proc.wait()
                try:
                    os.close(term.fd)
                except OSError:          # closed already by term.close()
                    pass


def test_every_command_also_runs_without_the_prompt(state_dir, lab_name, tmp_path):
    require_root()
    env = {**os.environ, "HOME": str(tmp_path), "LABCTL_STATE_DIR": str(state_dir)}

    def cli(commands: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "labctl", "cli", lab_name, "-c", commands],
                              capture_output=True, text=True, env=env, timeout=120)

    with Lab(lab_of(lab_name)):
        r = cli("pingall; net; dump; links; alpha ping -c1 -W2 beta; counters --busy; tc show leaf")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "*** Results: 2/2 pairs reachable" in r.stdout
        assert "leaf: alpha -> alpha:leaf, spine -> spine:leaf" in r.stdout
        assert re.search(r"<gpu alpha: 10\.[\d.]+/\d+.* netns=" + lab_name + "-alpha>", r.stdout), r.stdout
        assert "1 received" in r.stdout
        r = cli("alpha sh -c 'echo one; echo two'; alpha sleep 30 &")     # a ; inside quotes is the command's
        assert r.returncode == 0 and "one\ntwo\n" in r.stdout and "in the background" in r.stdout, r.stdout + r.stderr
        assert subprocess.run(["pgrep", "-f", "sleep 30"], capture_output=True).returncode == 1   # stopped at the end
        r = cli("link leaf:spine down; pingall")
        assert r.returncode == 1 and "0/2 pairs reachable" in r.stdout
        assert cli("link leaf:spine up; pingall").returncode == 0
        r = cli("link leaf spine down; pingall")                  # Mininet's form
        assert r.returncode == 1 and "link leaf:spine is down" in r.stdout and "0/2 pairs reachable" in r.stdout
        assert cli("link leaf spine up; pingall").returncode == 0
    assert lab_namespaces(lab_name + "-") == []
