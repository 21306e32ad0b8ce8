"""Errors a user can act on.

Every error names where the problem is (file, line, key), what is wrong, and what to do about it.
The CLI prints them without a traceback and exits with the error's exit code.
"""
from __future__ import annotations

from dataclasses import dataclass


class LabError(Exception):
    """A failure the user can fix; printed without a traceback."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message + (f"\n  fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class Where:
    """A place in an input file: the file, a 1-based line (if known) and a dotted key path."""

    file: str
    line: int | None = None
    key: str | None = None

    def __str__(self) -> str:
        s = self.file
        if self.line is not None:
            s += f":{self.line}"
        if self.key:
            s += f": {self.key}"
        return s


class InputError(LabError):
    """Bad topology, template or command-line input. Nothing has been created when it is raised."""

    exit_code = 2

    def __init__(self, where: Where, message: str, fix: str | None = None):
        super().__init__(message, fix)
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" + (f"\n  fix: {self.fix}" if self.fix else "")


class NotRootError(LabError):
    exit_code = 1

    def __init__(self, what: str):
        super().__init__(
            f"{what} needs root: it creates network namespaces, links and qdiscs",
            fix="run it as root, e.g. `sudo labctl ...` (the commands render, plan and graph need no root)",
        )
