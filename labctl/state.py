"""The lab directory: what a lab is and what was made for it, so that down and clean never guess.

    <state dir>/<lab>/plan.json   the compiled plan
    <state dir>/<lab>/state.json  status (building | up), the pid that built it, the topology file
    <state dir>/<lab>/journal     one line per thing created, written *before* creating it

The journal is append-only and flushed line by line, so a build killed with SIGKILL still leaves a
record of everything it may have made; `labctl clean` removes exactly that and nothing else.

labctl runs as root, so the state directory and every lab directory in it are trusted only if
root owns them and no one else may read or write them (0700, not a symlink), a lab is named only by
a valid lab name (never a path), and a directory is removed only if it sits directly in the state
directory and holds this lab's own record.

Each namespace's identity (device, inode and cookie) is journaled with the boot ID before the
namespace gets its name, and `down`/`clean` remove only a namespace whose identity matches: a
namespace of the same name made by something else (after a reboot, or after the lab's own was
deleted behind its back) is left alone. `up`, `down` and `clean` hold <state dir>/.lock (flock)
while they change anything, so two of them never interleave.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from labctl import procs
from labctl.errors import LabError
from labctl.names import valid_lab_name, valid_namespace


def state_root() -> Path:
    """$LABCTL_STATE_DIR, else $XDG_STATE_HOME/labctl, else ~/.local/state/labctl. Under sudo,
    `sudo -E` keeps the caller's $HOME and $XDG_STATE_HOME: root's own home is used instead, as for
    the prompt's history, since records in a directory the caller owns are records the caller can
    swap (and root kills the PIDs and removes the namespaces they name)."""
    env = os.environ.get("LABCTL_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0 and os.environ.get("SUDO_UID"):
        import pwd
        return Path(pwd.getpwuid(0).pw_dir) / ".local" / "state" / "labctl"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "labctl"


def checked_root(create: bool = False) -> Path:
    """The state directory, made 0700 if `create`; as root, refused unless root owns it and only
    root may write it (another user could otherwise plant records that root then acts on), and
    unless only root can rename a directory above it (or they could swap it after the check)."""
    root = state_root()
    if os.geteuid() == 0:
        from labctl.paths import root_only_above
        why = root_only_above(root)
        if why:
            raise LabError(f"the state directory {root} lies under a directory someone but root can change "
                           f"({why}): they could swap it for one of their own, with records of labs that "
                           "root then acts on (killing the PIDs and removing the namespaces they name)",
                           "set LABCTL_STATE_DIR to a directory under ones only root can write, e.g. "
                           "/var/lib/labctl, or unset it to use root's own (~root/.local/state/labctl)")
    if create and not root.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir(mode=0o700)
        except FileExistsError:
            pass
    if os.geteuid() == 0 and root.exists():
        _require_private_dir(root, "the state directory", "remove it (labctl recreates it), or set "
                             "LABCTL_STATE_DIR to a directory of root's")
    return root


def _require_private_dir(path: Path, what: str, remove_fix: str, others: int = 0o077) -> None:
    """As root: `path` is a plain directory (not a symlink) that root owns and no one else may
    (`others`: read or) write; otherwise whoever can write it could plant records (PIDs,
    namespaces) root acts on."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise LabError(f"{what} {path} is not a plain directory", remove_fix)
    if st.st_uid != 0 or st.st_mode & others:
        raise LabError(f"{what} {path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                       "labctl runs as root and trusts only a directory that root owns and no one else can "
                       + ("read or write" if others & 0o044 else "write"),
                       f"chown root:root {path} && chmod 700 {path}, if you are sure of what is in it; else {remove_fix}")


@dataclass
class LabDir:
    name: str
    path: Path

    @property
    def plan_file(self) -> Path:
        return self.path / "plan.json"

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def journal_file(self) -> Path:
        return self.path / "journal"

    def read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {"status": "unknown"}

    def write_state(self, **fields) -> None:
        state = self.read_state() if self.state_file.exists() else {}
        state.update(fields)
        tmp = self.state_file.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(state, indent=2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_file)

    def write_plan(self, plan: dict) -> None:
        """plan.json, whole or not at all: helpers read it while a lab changes (addresses learnt,
        Mininet's ifindexes), and a reader must never see half a plan."""
        tmp = self.plan_file.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(plan))          # compact: the C encoder, 10x faster
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.plan_file)

    def read_plan(self) -> dict:
        return json.loads(self.plan_file.read_text())

    def journal(self, kind: str, value: str) -> None:
        with open(self.journal_file, "a") as f:
            f.write(f"{kind} {value}\n")

    def journaled(self, kind: str) -> list[str]:
        """Everything of `kind` ever journaled, minus what was later journaled as released."""
        try:
            lines = self.journal_file.read_text().splitlines()
        except OSError:
            return []
        items: list[str] = []
        for line in lines:
            k, _, v = line.partition(" ")
            if k == kind and v not in items:
                items.append(v)
            elif k == f"released-{kind}" and v in items:
                items.remove(v)
        return items

    def is_record(self) -> bool:
        """A directory labctl made for this lab: directly in the state directory, not a link, and
        holding this lab's state.json, or nothing but what `claim` writes first (it was interrupted
        after its mkdir, before its first state.json was in place)."""
        if not valid_lab_name(self.name) or self.path != state_root() / self.name:
            return False
        try:
            if not stat.S_ISDIR(os.lstat(self.path).st_mode):
                return False
            names = {p.name for p in self.path.iterdir()}
            if not names:
                return True
            try:
                return json.loads(self.state_file.read_text()).get("lab") == self.name
            except ValueError:
                return names <= {"state.json", "state.tmp"}      # a state.json cut short
            except FileNotFoundError:
                return names <= {"state.tmp"}                      # the first one never renamed into place
        except (OSError, AttributeError):
            return False

    def namespaces(self) -> list[str]:
        """The namespaces the journal says were made for this lab; a line naming anything that is
        not one of this lab's namespaces is ignored, so an edited journal cannot aim `down` elsewhere."""
        return [n for n in self.journaled("netns") if valid_namespace(n, self.name)]

    def noter(self, name: str):
        """For nsutil.create/attach: journals namespace `name`'s identity and this boot's ID before
        the namespace is named, so a named namespace of this lab always has its identity on record."""
        boot = procs.boot_id()
        return lambda identity: self.journal("netns-id", f"{name} {identity} {boot}")

    def namespace_ids(self) -> dict[str, tuple[str, str]]:
        """namespace -> (identity, boot ID) as journaled (a released namespace has none)."""
        try:
            lines = self.journal_file.read_text().splitlines()
        except OSError:
            return {}
        ids: dict[str, tuple[str, str]] = {}
        for line in lines:
            kind, _, value = line.partition(" ")
            if kind == "netns-id" and len(value.split()) == 3:
                name, identity, boot = value.split()
                ids[name] = (identity, boot)
            elif kind == "released-netns":
                ids.pop(value, None)
        return ids

    def remove(self) -> None:
        """Delete the lab's record; anything that is not provably one is left alone."""
        if not self.is_record():
            raise LabError(f"{self.path} is not a labctl lab record; refusing to delete it")
        shutil.rmtree(self.path, ignore_errors=True)


def building_now(record: dict) -> bool:
    """The process that claimed a lab is still running (the same process: PID and start time)."""
    return procs.verified(record.get("builder") or "") is not None


def write_private(path: Path, text: str) -> None:
    """Write a secret (keys) readable by its owner only, never through a symlink planted in its place."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise LabError(f"cannot write {path}: {exc.strerror}",
                       "something was put in its place (a symlink?); remove it and try again") from None
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


AGENTS = "agents"     # <lab dir>/agents/NODE/: a node's own switch agent's share, control, report, log


def agent_directory(lab_path: Path, node: str) -> Path:
    """Node `node`'s agent directory; ValueError for a name labctl would not have given a node
    (the name comes from the command line of a root process and becomes a path)."""
    from labctl.names import valid_node_name
    if not valid_node_name(node):
        raise ValueError(f"{node!r} is not a node name")
    return Path(lab_path) / AGENTS / node


def agent_nodes(lab_path: Path) -> list[str]:
    """The nodes that have an agent directory in the lab, by name."""
    from labctl.names import valid_node_name
    try:
        return sorted(p.name for p in (Path(lab_path) / AGENTS).iterdir() if p.is_dir() and valid_node_name(p.name))
    except OSError:
        return []


def lab_dir(name: str) -> LabDir:
    """The record of lab `name`; a name that is not a lab name (a path, `..`) is refused, and so
    (as root) is a state directory or lab directory that someone else could have written."""
    if not valid_lab_name(name):
        raise LabError(f"{name!r} is not a lab name",
                       "a lab name is lower-case letters, digits and '-', starting with a letter, at most "
                       "24 characters (`labctl status` lists the labs)")
    d = LabDir(name, checked_root() / name)
    checked_lab_dir(d)
    return d


def checked_lab_dir(d: LabDir) -> LabDir:
    if os.geteuid() == 0:
        # (inside a state directory only root can enter, so its read bits keep nothing from anyone)
        _require_private_dir(d.path, f"lab {d.name!r}'s record", "labctl cannot vouch for what is in it: look "
                             f"at it, then remove it yourself (rm -r {d.path})", others=0o022)
    return d


def claim(name: str, plan: dict, topology_file: str | None) -> LabDir:
    """Create the lab directory atomically; refuse if a lab of that name exists or half-exists."""
    d = lab_dir(name)
    checked_root(create=True)
    try:
        d.path.mkdir(mode=0o700)
    except FileExistsError:
        state = d.read_state()
        pid = state.get("pid")
        if state.get("status") == "building" and building_now(state):
            raise LabError(f"lab {name!r} is being built right now by process {pid}",
                           "wait for it, or choose another name with --name") from None
        if state.get("status") == "up":
            raise LabError(f"lab {name!r} is already up",
                           f"`labctl down {name}` first, or start a second copy with --name {name}2") from None
        raise LabError(f"lab {name!r} has remains of an interrupted run in {d.path}",
                       "`labctl clean` removes them") from None
    d.write_state(lab=name, status="building", pid=os.getpid(), builder=procs.identity(os.getpid()),
                  started=time.time(), topology_file=topology_file, boot=procs.boot_id())
    d.write_plan(plan)
    return d


def all_labs() -> list[LabDir]:
    """Every lab record in the state directory (entries that are not one are ignored; one that
    someone else could have written is refused, as root)."""
    root = checked_root()
    if not root.is_dir():
        return []
    return [checked_lab_dir(LabDir(p.name, p)) for p in sorted(root.iterdir())
            if valid_lab_name(p.name) and p.is_dir() and not p.is_symlink()]


def namespace_owner(namespace: str, but: str | None = None) -> str | None:
    """The lab (other than `but`) whose journal lists `namespace`, if any."""
    for lab in all_labs():
        if lab.name != but and namespace in lab.namespaces():
            return lab.name
    return None


LOCK_WAIT_S = 900.0        # an `up` of a large lab with FRR converging takes minutes
_held = 0                  # lock() is re-entrant within a process (an experiment's up inside a run)


@contextlib.contextmanager
def lock(what: str, wait_s: float | None = None):
    """Hold <state dir>/.lock (flock, exclusive) for the block: `up`, `down` and `clean` of one
    state directory never interleave (two `up`s could otherwise both find a name free). As root
    the lock file must be root's own, like everything in the state directory."""
    global _held
    if _held:
        _held += 1
        try:
            yield
        finally:
            _held -= 1
        return
    path = checked_root(create=True) / ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise LabError(f"cannot open the lock {path}: {exc.strerror}",
                       f"something was put in its place (a symlink?); remove it: rm {path}") from None
    try:
        st = os.fstat(fd)
        if os.geteuid() == 0 and (not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022):
            raise LabError(f"the lock {path} is not a file of root's alone (uid {st.st_uid}, mode "
                           f"{stat.S_IMODE(st.st_mode):o})", f"rm {path} (labctl makes it again)")
        deadline = time.monotonic() + (LOCK_WAIT_S if wait_s is None else wait_s)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _lock_holder(fd)
                if time.monotonic() > deadline:
                    raise LabError(f"another labctl ({holder}) still holds {path}", "wait for it to finish, "
                                   "or stop it; a lock of a process that has gone is free at once") from None
                if not told:
                    print(f"labctl: waiting for another labctl ({holder}) to finish", file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{procs.identity(os.getpid())} {what}\n".encode(), 0)
        _held = 1
        try:
            yield
        finally:
            _held = 0
    finally:
        os.close(fd)        # releases the flock


def _lock_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").split()
        return f"process {text[0].partition(':')[0]}, {' '.join(text[1:])}" if text else "a process"
    except (OSError, IndexError):
        return "a process"
