"""`labctl cli LAB`: a prompt with Mininet's habits, over a running lab.

    labctl> srv1-gpu0 ping -c1 srv2-gpu1      a command inside a node; node names become addresses
    labctl> srv2-gpu1 iperf3 -s &             in the background until the prompt ends (no shell:
                                              for a pipe, srv1-gpu0 sh -c '... | ...')
    labctl> pingall                           every pair of end hosts
    labctl> nodes | links | net | dump        what the lab is made of
    labctl> route srv1-gpu0 srv2-gpu1 49152   a flow's path as the kernels hash it
    labctl> tc show leaf1                     queues; counters [--busy]; run WORKLOAD
    labctl> link leaf1:spine1 down            cut a link (and `up` again)
    labctl> exit

History is kept in ~/.labctl_history of the user it runs as (root's under sudo); Tab completes commands, node names and ports. Every command
also runs without the prompt: `labctl cli LAB -c 'pingall'` (several: separated by `;`).
"""
from __future__ import annotations

import cmd
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import click

from labctl.cli.base import cli
from labctl.cli.tick import CtrlCTick
from labctl.errors import LabError

SHELL_WORDS = ("|", "||", "&&", ">", ">>", "<", "2>", "2>&1", "&")   # what only a shell would read
HISTORY_NAME = ".labctl_history"
HISTORY_LINES = 1000
# a labctl command of the prompt's: labctl imported first (at /), then run in the prompt's directory
CHILD = ("import os, sys; from labctl.cli import main; os.chdir(sys.argv[1]); "
         "sys.argv = ['labctl'] + sys.argv[2:]; main()")


class Prompt(CtrlCTick, cmd.Cmd):
    prompt = "labctl> "

    def __init__(self, lab, stdout=None):
        super().__init__(stdout=stdout)
        from labctl import lifecycle
        self.lab, self.lifecycle = lab, lifecycle
        self.plan = lifecycle.load_plan(lab)
        self.names = {n.name for n in self.plan.nodes}
        self.failed = False
        self.background: list[subprocess.Popen] = []
        self.intro = (f"lab {self.plan.lab}: {len(self.plan.nodes)} nodes, {len(self.plan.links)} links. "
                      "Type help, or a node name and a command. Ctrl-D or exit leaves.")

    def say(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    # -- what the lab is -------------------------------------------------------------------------
    def do_nodes(self, arg):
        """nodes: every node and its kind"""
        self.say(" ".join(f"{n.name}({n.kind})" for n in self.plan.nodes))

    def do_links(self, arg):
        """links: every link with its rate"""
        from labctl.units import format_rate
        for lk in self.plan.links:
            self.say(f"{lk.a} <-> {lk.b}  {format_rate(lk.rate_bps)} ({format_rate(lk.lab_rate_bps)} in the lab)")

    def do_net(self, arg):
        """net: each node's ports and what they connect to (Mininet's net)"""
        for n in self.plan.nodes:
            self.say(f"{n.name}: " + ", ".join(f"{i.name} -> {i.peer_node}:{i.peer_iface}" for i in n.interfaces))

    def do_dump(self, arg):
        """dump: each node with its namespace and addresses (Mininet's dump)"""
        for n in self.plan.nodes:
            addrs = [i.address for i in n.interfaces if i.address] + ([n.loopback] if n.loopback else [])
            self.say(f"<{n.kind} {n.name}: {', '.join(addrs) or 'no address'} netns={n.namespace}>")

    # -- using it ----------------------------------------------------------------------------------
    def do_pingall(self, arg):
        """pingall [FABRIC]: ping every pair of end hosts that share a fabric"""
        tried, failed = self.lifecycle.pingall(self.plan, arg.strip() or None,
                                               backend=self.lifecycle.backend_of(self.lab))
        for a, b in failed:
            self.say(f"  {a} -> {b}: no reply")
        self.say(f"*** Results: {tried - len(failed)}/{tried} pairs reachable"
                 + (f"; {self.lifecycle.why_none(self.plan, arg.strip() or None)}" if not tried else ""))
        self.failed = self.failed or bool(failed) or not tried    # as `labctl pingall`: nothing checked fails

    def do_route(self, arg):
        """route SRC DST [SPORT]: the path a RoCE flow takes, hop by hop"""
        words = arg.split()
        if len(words) not in (2, 3):
            raise LabError("route SRC DST [SPORT]")
        sport = int(words[2]) if len(words) == 3 else 49152
        hops = self.lifecycle.trace_path(self.plan, words[0], words[1], sport, 4791)
        self.say(f"udp sport {sport}: " + " -> ".join(h["node"] + (f" ({h['out']})" if h["out"] else "") for h in hops))

    def do_link(self, arg):
        """link NODE:PORT down|up, or Mininet's link NODE1 NODE2 down|up: cut or restore a link;
        routes reconverge"""
        from labctl.lifecycle import targets
        words = arg.split()
        if len(words) == 3 and words[2] in ("down", "up") and ":" not in words[0]:
            ports = [i.name for i in self.plan.node(words[0]).interfaces if i.peer_node == words[1]] \
                if words[0] in self.names else []
            if len(ports) != 1:
                raise LabError(f"{words[0]} and {words[1]} share {len(ports)} links",
                               "name the port: link NODE:PORT down|up (`net` lists them)")
            words = [f"{words[0]}:{ports[0]}", words[2]]
        if len(words) != 2 or words[1] not in ("down", "up"):
            raise LabError("link NODE:PORT down|up, or link NODE1 NODE2 down|up")
        node, iface = targets.port(self.plan, words[0])
        changed = self.lifecycle.set_link_state(self.lab, self.plan, node, iface.name, words[1] == "up")
        self.say(f"link {words[0]} is {words[1]}; {changed} routes changed")

    def _labctl(self, argv: list[str]) -> None:
        """A labctl command on this lab, as its own process (its output is the command's)."""
        # its tables as wide as the terminal where there is one; piped, the child decides (a fixed
        # 80 squeezed `tc show` to n… p… c…)
        width = str(shutil.get_terminal_size().columns)
        env = {**os.environ, "COLUMNS": width} if self.stdout.isatty() else dict(os.environ)
        # -P and cwd=/: labctl is imported from its install, never from a labctl/ folder of the
        # directory the user stands in (this runs as root); the command then runs where the user
        # stands, so a relative path in it means what it means at the prompt
        r = subprocess.run([sys.executable, "-P", "-c", CHILD, os.getcwd(), *argv], capture_output=True, text=True,
                           env=env, cwd="/")
        self.stdout.write(r.stdout + r.stderr)
        self.failed = self.failed or r.returncode != 0

    def do_tc(self, arg):
        """tc show NODE[:PORT] | tc set NODE[:PORT] OPTIONS: as `labctl tc`"""
        self._labctl(["tc", *shlex.split(arg), "--lab", self.plan.lab])

    def do_counters(self, arg):
        """counters [--busy] [--losses]: as `labctl counters`"""
        self._labctl(["counters", self.plan.lab, *shlex.split(arg)])

    def do_run(self, arg):
        """run WORKLOAD: play a workload on this lab, as `labctl run`"""
        self._labctl(["run", *shlex.split(arg), "--lab", self.plan.lab])

    def default(self, line):
        """NODE COMMAND... [&]: the command inside the node, other nodes' names replaced by their
        addresses; no shell runs it (for a pipe: NODE sh -c '...'); a last `&` runs it in the
        background until the prompt ends, as Mininet's does."""
        words = shlex.split(line)
        if not words or words[0] not in self.names:
            self.say(f"*** unknown command {words[0] if words else line!r}: type help")
            self.failed = True
            return
        background = words[-1] == "&"
        words = words[:-1] if background else words
        shell = [w for w in words if w in SHELL_WORDS]
        if shell:
            self.say(f"*** {shell[0]!r}: no shell runs a node's command here; for a pipeline or redirection write "
                     f"{words[0]} sh -c '...'")
            self.failed = True
            return
        node = self.plan.node(words[0])
        from labctl.lifecycle import targets
        argv = self.lifecycle.backend_of(self.lab).exec_argv(
            node, targets.with_addresses(self.plan, node.name, words[1:]))
        if background:
            self.stdout.flush()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
            self.background.append(p)
            self.say(f"[{len(self.background)}] {p.pid}: in the background until you leave the prompt (its output "
                     "is not shown)")
            return
        if self.stdout is not sys.stdout:       # a caller that reads what the prompt says
            r = subprocess.run(argv, capture_output=True, text=True)
            self.stdout.write(r.stdout + r.stderr)
            self.failed = self.failed or r.returncode != 0
            return
        # the terminal's own: output as it comes (`ping` prints each reply), Ctrl-C stops the
        # command and not the prompt, as in Mininet
        self.stdout.flush()
        p = subprocess.Popen(argv)
        try:
            code = p.wait()
        except KeyboardInterrupt:
            try:
                code = p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait()
            self.say("")
        self.failed = self.failed or code != 0

    def stop_background(self) -> None:
        """Stop what `NODE COMMAND &` started (each in a session of its own, so its whole group)."""
        import signal
        for p in self.background:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    p.kill()
                    p.wait()
        self.background.clear()

    def do_exit(self, arg):
        """exit: leave the prompt (the lab stays up)"""
        return True

    do_quit = do_exit

    def do_EOF(self, arg):
        self.say("")
        return True

    def emptyline(self):
        pass

    def onecmd(self, line):
        try:
            return super().onecmd(line)
        except LabError as exc:
            self.say(f"*** {exc}")
            self.failed = True
        except (ValueError, KeyError) as exc:
            self.say(f"*** {exc}")
            self.failed = True
        return False

    # -- completion --------------------------------------------------------------------------------
    def completenames(self, text, *ignored):
        return super().completenames(text, *ignored) + sorted(n for n in self.names if n.startswith(text))

    def completedefault(self, text, line, begidx, endidx):
        ports = [f"{n.name}:{i.name}" for n in self.plan.nodes for i in n.interfaces]
        return sorted(x for x in list(self.names) + ports if x.startswith(text))


@cli.command(name="cli")
@click.argument("lab", required=False)
@click.option("-c", "commands", help="run these commands (separated by ;) and exit, instead of the prompt")
def cli_(lab, commands):
    """A prompt over a running lab, with Mininet's habits (node COMMAND, pingall, net, dump, ...).

    \b
    Its commands (`help` at the prompt says each):
      NODE COMMAND [&]     a command inside the node, other nodes' names as their addresses;
                           no shell (a pipe: NODE sh -c '...'); & runs it in the background
      pingall | nodes | links | net | dump
      route SRC DST [SPORT] | link NODE:PORT down|up (or link NODE1 NODE2 down|up)
      tc show|set ... | counters [--busy] | run WORKLOAD | exit (Ctrl-D)
    Ctrl-C stops a node's command, not the prompt.

    \b
    Example:
      sudo labctl cli ls
      labctl> srv1-gpu0 ping -c1 srv2-gpu1
      labctl> pingall
      sudo labctl cli ls -c 'pingall; route srv1-gpu0 srv2-gpu1 49158'
    """
    import signal
    # Ctrl-C must reach the main thread, waiting in readline: numpy's OpenBLAS starts a thread when
    # lifecycle is imported, and a SIGINT the kernel gave that thread never woke readline (ci73-75:
    # the prompt sat for 30 s). The thread inherits the mask it is started with.
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        from labctl import lifecycle
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    lifecycle.require_root("labctl cli")
    # Ctrl-C stops a node's command and keeps the prompt: a process started with SIGINT ignored
    # (a shell's background job, a test runner's worker) would keep ignoring it, and so would the
    # commands it starts
    signal.signal(signal.SIGINT, signal.default_int_handler)
    prompt = Prompt(lifecycle.default_lab(lab, positional=True))
    if commands:
        try:
            for line in split_commands(commands):
                prompt.onecmd(line)
        finally:
            prompt.stop_background()
        raise SystemExit(1 if prompt.failed else 0)
    try:
        import readline
        readline.set_completer_delims(" \t")
    except ImportError:
        readline = None
    history = history_file()
    if readline is not None:
        for line in read_history(history):
            readline.add_history(line)
    try:
        while True:
            try:
                prompt.cmdloop()
                break
            except KeyboardInterrupt:       # at the prompt's own line: a new line, as Mininet's
                prompt.say("")
                prompt.intro = None
    finally:
        prompt.postloop()
        prompt.stop_background()
        if readline is not None:
            n = readline.get_current_history_length()
            write_history(history, [readline.get_history_item(i) for i in range(max(1, n - HISTORY_LINES + 1), n + 1)])


def split_commands(text: str) -> list[str]:
    """`-c` commands, split at each `;` outside quotes (`h1 sh -c 'echo a; echo b'` is one)."""
    out, cur, quote = [], [], None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return [c for c in out if c]


def history_file() -> Path:
    """~/.labctl_history of the user this runs as: root's under sudo, even with `sudo -E`, whose
    $HOME is the calling user's (a file there is that user's to swap for a symlink)."""
    import pwd
    try:
        return Path(pwd.getpwuid(os.geteuid()).pw_dir) / HISTORY_NAME
    except KeyError:
        return Path.home() / HISTORY_NAME


def _open_history(path: Path, write: bool) -> int | None:
    """The history file, opened without following a symlink, and only if it is a plain file of this
    user's with no other name (a hard link to /etc/shadow is not a history file); else None, said why."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_RDWR | os.O_CREAT if write else os.O_RDONLY)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    except OSError as exc:
        print(f"labctl: not using the history file {path}: {exc.strerror} (a symlink?)", file=sys.stderr)
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        print(f"labctl: not using the history file {path}: it is not a plain file of uid {os.geteuid()}'s "
              "alone", file=sys.stderr)
        return None
    return fd


def read_history(path: Path) -> list[str]:
    fd = _open_history(path, write=False)
    if fd is None:
        return []
    with os.fdopen(fd, "rb") as f:
        lines = f.read(4 << 20).decode(errors="replace").splitlines()
    return [line for line in lines if line and not line.startswith("_HiStOrY_V2_")][-HISTORY_LINES:]


def write_history(path: Path, lines: list[str]) -> None:
    fd = _open_history(path, write=True)
    if fd is None:
        return
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.truncate(0)
        f.write("".join(f"{line}\n" for line in lines if line).encode())
