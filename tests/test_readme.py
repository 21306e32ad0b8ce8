"""The README's quick start runs as written: every console line of it is run, and every output line it
quotes must be what the command prints. The lab is renamed to a test name (namespaces are global,
and a user's `ls` lab must never be touched), and quoted outputs are renamed with it.
tests/test_guide.py holds the user guide's checks (and every other command block's marking)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import lab_namespaces, require_root

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.netns


def quick_start_blocks() -> list[list[tuple[str, list[str]]]]:
    """The console blocks of the quick start: [(command, [quoted output lines])]."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## 60-second quick start", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        steps: list[tuple[str, list[str]]] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps and line.strip():
                steps[-1][1].append(line)
        blocks.append(steps)
    return blocks


def renamed(text: str, lab: str) -> str:
    """The README's lab `ls` as the test's lab: the argument, namespace prefixes, messages."""
    text = re.sub(r"(?<![\w/.-])ls(?=-[a-z])", lab, text)          # ls-leaf1
    text = re.sub(r"(?<![\w/.-])ls(?![\w/.-])", lab, text)          # ls as a word
    return text


def argv(command: str, lab: str) -> list[str]:
    command = command.split(" | ")[0].split("  #")[0].split(" #")[0].strip()   # no pipes, no comments
    words = shlex.split(renamed(command, lab))
    if words[0] == "sudo":
        words = words[1:]
    if words[0] == "labctl":
        words = [sys.executable, "-m", "labctl", *words[1:]]
        if words[3] == "up":
            words += ["--name", lab]
    # run from a temporary directory (a run's results go to ./runs): the README's paths are the repo's
    return [str(ROOT / w) if "/" in w and (ROOT / w).exists() else w for w in words]


def test_the_quick_start_runs_as_written(state_dir, lab_name, tmp_path):
    require_root()
    env = {**os.environ, "LABCTL_STATE_DIR": str(state_dir), "COLUMNS": "200"}
    blocks = quick_start_blocks()
    assert len(blocks) == 2 and len(blocks[0]) >= 8, blocks
    ran = 0
    try:
        for steps in blocks:
            for command, quoted in steps:
                r = subprocess.run(argv(command, lab_name), capture_output=True, text=True, cwd=tmp_path, env=env,
                                   timeout=300)
                assert r.returncode == 0, (command, r.stdout[-2000:], r.stderr[-2000:])
                printed = r.stdout.splitlines()
                for line in quoted:
                    assert renamed(line, lab_name) in printed, (command, line, printed[-20:])
                ran += 1
    finally:
        subprocess.run([sys.executable, "-m", "labctl", "down", lab_name], capture_output=True, env=env)
    assert ran == sum(len(b) for b in blocks)
    assert lab_namespaces(lab_name + "-") == []
