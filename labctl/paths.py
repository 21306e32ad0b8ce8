"""Paths a user typed or a file holds: asking about them never raises; a run directory is made new.

pathlib's is_file() raises on a name too long for the file system (ENAMETOOLONG), and any call
raises ValueError on an embedded NUL byte; for a path from input the answer is then just "no".
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from labctl.errors import LabError


def is_file(path) -> bool:
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def is_dir(path) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def new_run_dir(path: Path, option: str = "--out", what: str = "run") -> Path:
    """Create a run directory that is new (or empty): results are never mixed with, or written over,
    what another run or another user left there. An existing one must be a plain directory of the
    user labctl runs as, that no one else may write: root writes every file of a run into it, and
    whoever owns it could swap one of them for a symlink to a file of root's. Every directory above
    it must be one that no one else can change either: whoever may rename one of them can put a
    link in the run directory's place while root writes into it (`what` names the directory in
    messages: a run, an export)."""
    path = Path(path)
    link = foreign_link(path)
    if link is not None:
        raise LabError(f"{option} {path}: {link} is a symlink of uid {os.lstat(link).st_uid}'s, which labctl (uid "
                       f"{os.geteuid()}) does not follow to make a {what}: it could point anywhere root may write",
                       "give a directory whose path has no one else's symlink in it")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise LabError(f"{option} {path}: {getattr(exc, 'strerror', None) or exc}",
                       f"give a new directory for the {what}") from None
    if st is None:
        _refuse_changeable(path.parent, path, option, what)
        path.parent.mkdir(parents=True, exist_ok=True)
    else:
        if not stat.S_ISDIR(st.st_mode):
            raise LabError(f"{option} {path} is not a directory", f"give a new directory for the {what}")
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise LabError(f"{option} {path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                           f"labctl (uid {os.geteuid()}) writes a {what} only into a directory of its own that no "
                           f"one else can write", f"give a new directory for the {what} (labctl makes it)")
        if any(path.iterdir()):
            raise LabError(f"{option} {path} is not empty: a {what} directory is made new, so that its files are "
                           f"this {what}'s alone", "choose a new directory" + (
                               ", or leave --out out for runs/<time>-<name>" if what == "run" else
                               f", or remove {path} first"))
        _refuse_changeable(path.parent, path, option, what)
        return path
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        raise LabError(f"{option} {path} appeared while labctl made it", f"give a new directory for the {what}") \
            from None
    return path


def readable_by(path: Path, uid: int) -> bool:
    """Whether user `uid` could read `path` themselves: every directory on its real path searchable
    by them and the file readable, by its owner, group or other bits (root reads anything). A path
    that does not resolve is left to the reader's own error."""
    if uid == 0:
        return True
    try:
        real = Path(os.path.realpath(path))
        import pwd
        entry = pwd.getpwuid(uid)
        groups = set(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except KeyError:
        groups = set()
    except (OSError, ValueError):
        return True

    def may(st: os.stat_result, bit: int) -> bool:      # bit: 4 read, 1 search
        if st.st_uid == uid:
            return bool(st.st_mode & (bit << 6))
        if st.st_gid in groups:
            return bool(st.st_mode & (bit << 3))
        return bool(st.st_mode & bit)
    try:
        if not all(may(os.stat(d), 1) for d in reversed(real.parents)):
            return False
        return may(os.stat(real), 4)
    except OSError:
        return True


def trusted_owners() -> set[int]:
    """Who may own the directories labctl writes root's files under: root, the user labctl runs as,
    and the user who ran it through sudo (an admin's own home or clone)."""
    owners = {0, os.geteuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if sudo.isdigit():
        owners.add(int(sudo))
    return owners


def changeable_above(path: Path) -> str | None:
    """Why someone labctl does not trust (trusted_owners) could rename a directory on the way to
    `path`, and so put a link in its place: the first existing directory at or above `path` (by its
    real path) owned by another uid, or writable by others without the sticky bit. None if no one can."""
    owners = trusted_owners()
    try:
        real = Path(os.path.realpath(path))
    except (OSError, ValueError):
        return None
    for d in [real, *real.parents]:
        try:
            st = os.stat(d)
        except OSError:
            continue                 # not made yet: labctl makes it, as root
        if not stat.S_ISDIR(st.st_mode):
            continue
        if st.st_uid not in owners:
            return f"{d} belongs to uid {st.st_uid}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"{d} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'}"
    return None


def _refuse_changeable(where: Path, path: Path, option: str, what: str) -> None:
    why = changeable_above(where)
    if why:
        raise LabError(f"{option} {path}: {why}, who could move it and put a link in its place while labctl "
                       f"(uid {os.geteuid()}) writes the {what}'s files: they would land wherever the link points",
                       "give a directory under one that only root (or you) can write, e.g. /var/tmp/labctl/NAME "
                       "or your own home")


def root_only_above(path: Path) -> str | None:
    """Why someone but root could rename a directory above `path` (as written, and by its real
    path), and so swap `path` for a directory or link of their own; None if no one can. A sticky
    directory (/tmp) counts as root's: others cannot rename what root made in it."""
    written = Path(os.path.abspath(path))
    try:
        real = Path(os.path.realpath(path))
    except (OSError, ValueError):
        real = written
    for d in dict.fromkeys([*written.parents, *real.parents]):
        why = _unsafe(d)
        if why:
            return why
    return None


def foreign_link(path: Path) -> Path | None:
    """The first directory on `path` (as written, from /) that is a symlink owned by neither root
    nor this process's user, or None."""
    here = Path(os.path.abspath(path))
    for p in [*reversed(here.parents), here]:
        try:
            st = os.lstat(p)
        except OSError:
            return None              # from here on labctl makes what is missing
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            return p
    return None


def untrusted_tree(resolved: Path, st: os.stat_result) -> list[str]:
    """Why an opened file (`st`, its fstat) at `resolved` is not root's alone: the file, or any
    directory above it (one that others may write could have the file's directory swapped)."""
    reasons = [why for why in [unsafe_stat(resolved, st)] + [_unsafe(d) for d in resolved.parents] if why]
    return list(dict.fromkeys(reasons))


def untrusted(paths: list[Path]) -> list[str]:
    """Why these files (and their directories) are not trusted: owned or writable by someone but root."""
    reasons = []
    for p in paths:
        for q in _with_parent(p):
            why = _unsafe(q)
            if why and why not in reasons:
                reasons.append(why)
    return reasons


def _with_parent(p: Path) -> list[Path]:
    out = [p]
    try:
        out.append(p.resolve().parent)
        if p.is_symlink():
            out.append(p.resolve())
    except OSError:
        pass
    return out


def _unsafe(p: Path) -> str | None:
    try:
        st = os.lstat(p)
    except OSError:
        return None
    return unsafe_stat(p, st)


def unsafe_stat(p: Path, st: os.stat_result) -> str | None:
    """Why `p` (whose stat is `st`) could be changed by someone but root; None if it cannot."""
    if stat.S_ISLNK(st.st_mode):
        return None if st.st_uid == 0 else f"{p} is a symlink owned by uid {st.st_uid}"
    if st.st_uid != 0:
        return f"{p} is owned by uid {st.st_uid}, not root"
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
        return f"{p} is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'}"
    return None
