"""The LABCTL_* environment variables that pick a mechanism (doctor names each one's choice)."""
from __future__ import annotations

import os

from labctl.errors import LabError


def choice(env: str, choices: tuple[str, ...], what: str) -> str:
    """The value of `env` (unset or empty: "auto"), one of `choices`, else a LabError with the fix."""
    wanted = os.environ.get(env, "auto") or "auto"
    if wanted not in choices:
        raise LabError(f"{env}={wanted!r} is not {what}",
                       f"set {env} to one of {', '.join(choices)} (or leave it unset: auto)")
    return wanted
