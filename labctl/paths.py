"""Paths a user typed or a file holds: asking about them never raises.

pathlib's is_file() raises on a name too long for the file system (ENAMETOOLONG), and any call
raises ValueError on an embedded NUL byte; for a path from input the answer is then just "no".
"""
from __future__ import annotations

from pathlib import Path


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
