"""Running a Mininet topology file to read it (mininet_topo.py), as safely as running a user's
Python as root can be.

- The file is opened once, without following a final symlink, and, as root, trusted only if
  root owns it and every directory above it, none writable by anyone else (a sticky directory
  such as /tmp excepted), or if the user said --trust. Its bytes go to the reader on stdin: the
  path is never opened again, so nothing can be swapped in between the check and the run.
- The reader runs under the system Python in isolated mode (-I: no PYTHON* variables, no user
  site), with cwd /, no terminal on stdin, files of at most FILE_LIMIT bytes, and at most
  READ_TIMEOUT_S. As root it is PID 1 of a PID namespace of its own (`unshare --pid --kill-child`):
  when it ends, the kernel ends everything the file started, however it detached.
- Its answer is checked for shape before anything of it is used; the file's own output is shown
  (its last OUTPUT_TAIL bytes).
"""
from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from labctl.errors import InputError, Where
from labctl.paths import untrusted_tree

SYSTEM_PYTHON = "/usr/bin/python3"
UNSHARE = "/usr/bin/unshare"
READER = Path(__file__).with_name("mininet_topo.py")
READ_TIMEOUT_S = 60
SOURCE_LIMIT = 4 << 20
FILE_LIMIT = 32 << 20
OUTPUT_TAIL = 64 << 10


def read(file: str | None, topo: str, trust: bool) -> dict:
    """The reader's answer for `topo` in `file` (or Mininet's own, with no file), checked."""
    where = Where(str(file) if file else "--topo")
    source = _source(Path(file), trust) if file else b""
    if not Path(SYSTEM_PYTHON).is_file():
        raise InputError(Where("--topo"), f"{SYSTEM_PYTHON} is missing", "install Mininet (./install.sh does)")
    shown = str(Path(file).resolve()) if file else "-"
    command = [SYSTEM_PYTHON, "-I", str(READER), shown, topo]
    if os.geteuid() == 0 and Path(UNSHARE).is_file():
        command = [UNSHARE, "--pid", "--fork", "--kill-child", *command]
    with tempfile.TemporaryFile() as src, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        src.write(source)
        src.seek(0)
        p = subprocess.Popen(command, stdin=src, stdout=out, stderr=err, cwd="/", start_new_session=True,
                             preexec_fn=_limits)
        try:
            p.wait(timeout=READ_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise InputError(where, f"reading Mininet topology {topo!r} took more than {READ_TIMEOUT_S} s, and was "
                             "stopped", "does the file (or its build()) wait for something, or build a huge "
                             "topology?") from None
        finally:
            if p.returncode is None:
                os.killpg(p.pid, signal.SIGKILL)      # the reader's group (and with unshare, its namespace)
                p.wait()
        answer = _tail(out, FILE_LIMIT)
        said = _tail(err, OUTPUT_TAIL)
    if said.strip():
        sys.stderr.write(said if said.endswith("\n") else said + "\n")      # the file's own output
    try:
        doc = json.loads(answer)
    except ValueError:
        raise InputError(where, f"reading Mininet topology {topo!r} ended without an answer (exit status "
                         f"{p.returncode})", "did the file end the process itself (os._exit, a signal), or "
                         "exceed the limits (60 s, 32 MB of output)?") from None
    return _checked(doc, file, topo, where)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def _tail(f, limit: int) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit))
    return f.read().decode(errors="replace")


def _source(path: Path, trust: bool) -> bytes:
    """The file's bytes, read from one descriptor; as root, only from a file root alone controls."""
    where = Where(str(path))
    try:
        fd = os.open(path.resolve(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(where, f"cannot open the Mininet topology file: {exc.strerror}",
                         "give the path to the .py file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(where, "not a regular file", "give the path to the .py file")
        if st.st_size > SOURCE_LIMIT:
            raise InputError(where, f"{st.st_size} bytes: more than a topology file needs", "give the .py file")
        if os.geteuid() == 0 and not trust:
            reasons = untrusted_tree(path.resolve(), st)
            if reasons:
                raise InputError(where, "reading this Mininet topology runs its Python as root, and it is not "
                                 f"trusted ({'; '.join(reasons[:3])})",
                                 "read it, then make the file and every directory above it root's and writable "
                                 "by no one else (sudo chown root: and sudo chmod go-w), or say you trust it: --trust")
        chunks, left = [], SOURCE_LIMIT
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _checked(doc: object, file: str | None, topo: str, where: Where) -> dict:
    """The answer, if it has the shape mininet_topo.py writes; else a located refusal."""
    def bad(what: str):
        return InputError(where, f"reading Mininet topology {topo!r} gave {what}", "is the file a Mininet topology?")
    if not isinstance(doc, dict):
        raise bad("no answer")
    if "mininet" in doc:
        raise InputError(Where("--topo"), f"Mininet does not import under {SYSTEM_PYTHON}: {str(doc['mininet'])[:200]}",
                         "install it: apt-get install mininet (./install.sh does)")
    if "error" in doc:
        line = doc.get("line")
        message = str(doc["error"])[:500]
        named = message.startswith("LookupError: no topology")
        raise InputError(Where(str(file), line=line if isinstance(line, int) else None) if file else where,
                         f"cannot read Mininet topology {topo!r}: {message}",
                         "check the name: --topo NAME or NAME,ARG,KEY=VALUE (the message lists the names)" if named
                         else "the topology's own Python failed (as `mn --custom` would); fix it there")
    strings = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)  # noqa: E731
    if not strings(doc.get("hosts")) or not strings(doc.get("switches")) or not isinstance(doc.get("links"), list):
        raise bad("no lists of hosts, switches and links")
    for lk in doc["links"]:
        if not (isinstance(lk, dict) and isinstance(lk.get("a"), str) and isinstance(lk.get("b"), str)):
            raise bad(f"a link it cannot read: {str(lk)[:80]}")
        for key in ("bw", "loss"):
            if key in lk and (isinstance(lk[key], bool) or not isinstance(lk[key], (int, float))):
                raise bad(f"link {lk['a']}-{lk['b']}: {key} must be a number, not {str(lk[key])[:40]!r}")
        for key in ("delay", "jitter"):
            if key in lk and not isinstance(lk[key], (str, int, float)):
                raise bad(f"link {lk['a']}-{lk['b']}: {key} must be a duration")
        if "ignored" in lk and not strings(lk["ignored"]):
            raise bad("a link's options it cannot read")
    ignored = doc.get("ignored") or {}
    if not isinstance(ignored, dict) or not all(isinstance(k, str) and strings(v) for k, v in ignored.items()):
        raise bad("node options it cannot read")
    return doc
