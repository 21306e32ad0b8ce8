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


def new_run_dir(path: Path, option: str = "--out") -> Path:
    """Create a run directory that is new (or empty): results are never mixed with, or written over,
    what another run or another user left there. An existing one must be a plain directory of the
    user labctl runs as, that no one else may write: root writes every file of a run into it, and
    whoever owns it could swap one of them for a symlink to a file of root's."""
    path = Path(path)
    link = foreign_link(path)
    if link is not None:
        raise LabError(f"{option} {path}: {link} is a symlink of uid {os.lstat(link).st_uid}'s, which labctl (uid "
                       f"{os.geteuid()}) does not follow to make a run: it could point anywhere root may write",
                       "give a directory whose path has no one else's symlink in it")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise LabError(f"{option} {path}: {getattr(exc, 'strerror', None) or exc}", "give a new directory for the run") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise LabError(f"{option} {path} is not a directory", "give a new directory for the run")
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise LabError(f"{option} {path} belongs to uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
                           f"labctl (uid {os.geteuid()}) writes a run only into a directory of its own that no one "
                           "else can write", "give a new directory for the run (labctl makes it)")
        if any(path.iterdir()):
            raise LabError(f"{option} {path} is not empty: a run directory is made new, so that its files are "
                           "this run's alone", "choose a new directory, or leave --out out for runs/<time>-<name>")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        raise LabError(f"{option} {path} appeared while labctl made it", "give a new directory for the run") from None
    return path


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
