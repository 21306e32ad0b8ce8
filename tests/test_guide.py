"""The README and the user guide under docs/: every command in them is run by a test or marked as an
example, the commands this module owns run as written and print what the page quotes, the README stays
a front door, and the guide builds with `mkdocs build --strict` (into a temporary directory).

A command block is a fenced block whose info string is console, sh, shell or bash and that holds a
command (a `$ ` line in a console block; any line but a comment in a shell block). The line before its
fence is its marker: `<!-- example -->`, or `<!-- run by FILE -->` where FILE runs it."""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_INFOS = {"console", "sh", "shell", "bash"}
MARKER = re.compile(r"<!-- (example|run by (\S+)) -->")
THIS = "tests/test_guide.py"


@dataclass
class Block:
    page: Path
    line: int                 # the opening fence's line, 1-based
    info: str
    marker: str               # the line before the fence
    body: list[str]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[str]:
        if self.info == "console":
            return [l[2:] for l in self.body if l.startswith("$ ")]
        if self.info in COMMAND_INFOS:
            return [l for l in self.body if l.strip() and not l.lstrip().startswith("#")]
        return []


def blocks(page: Path) -> list[Block]:
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start, info = i, lines[i][3:].strip().split(" ")[0]
            marker = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            found.append(Block(page, start + 1, info, marker.strip(), lines[start + 1:i]))
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]


def test_every_fence_says_what_it_holds():
    """A fence without an info string could hide commands from the check below."""
    bare = [b.where for b in all_blocks() if not b.info]
    assert bare == [], f"give these fences an info string (text, yaml, console, sh...): {bare}"


def test_every_command_is_run_by_a_test_or_marked_as_an_example():
    unmarked = [(b.where, b.commands()[0]) for b in all_blocks() if b.commands() and not MARKER.fullmatch(b.marker)]
    assert unmarked == [], f"precede each with <!-- example --> or <!-- run by FILE -->: {unmarked}"
    assert sum(1 for b in all_blocks() if b.commands()) >= 10


def test_a_block_run_by_a_file_names_a_file_that_reads_its_page():
    for b in all_blocks():
        m = MARKER.fullmatch(b.marker)
        if not (m and m.group(2)) or m.group(2) == THIS:     # this module's blocks: run below
            continue
        runner = ROOT / m.group(2)
        assert runner.is_file(), (b.where, m.group(2))
        page = "README" if b.page.name == "README.md" else b.page.name
        assert page in runner.read_text(), f"{b.where}: {m.group(2)} never mentions {page}"


def own_blocks() -> list[Block]:
    return [b for b in all_blocks() if MARKER.fullmatch(b.marker) and MARKER.fullmatch(b.marker).group(2) == THIS]


def steps(block: Block) -> list[tuple[str, list[str]]]:
    """(command, [quoted output lines]) of a console block."""
    out: list[tuple[str, list[str]]] = []
    for line in block.body:
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out and line.strip():
            out[-1][1].append(line)
    return out


def test_the_guide_commands_without_root_run_as_written(tmp_path):
    """Each block this module owns needs no root. Every quoted output line must be printed; a quoted
    `error:` means the command must fail with exit code 2 (bad input), anything else must succeed."""
    own = own_blocks()
    assert own, "no block is marked <!-- run by tests/test_guide.py -->"
    env = {**os.environ, "LABCTL_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
    ran = 0
    for block in own:
        assert block.info == "console", block.where
        for command, quoted in steps(block):
            words = shlex.split(command.split("  #")[0])
            assert words[0] == "labctl", f"{block.where}: only labctl commands without sudo run here: {command}"
            r = subprocess.run([sys.executable, "-m", "labctl", *words[1:]], capture_output=True, text=True,
                               cwd=ROOT, env=env, timeout=120)
            printed = (r.stdout + r.stderr).splitlines()
            expected_rc = 2 if any(q.startswith("error:") for q in quoted) else 0
            assert r.returncode == expected_rc, (block.where, command, r.returncode, printed[-20:])
            for line in quoted:
                assert line in printed, (block.where, command, line, printed[-20:])
            ran += 1
    assert ran == sum(len(steps(b)) for b in own)


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    linked = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(set(linked)) >= 15, linked
    missing = [l for l in linked if not (ROOT / l).exists()]
    assert missing == [], missing


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail("mkdocs and mkdocs-material are missing: ./install.sh installs them (pip install -e '.[docs]')")
    # no -q: it silences the warnings that --strict turns into failures
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_guide_builds_strict(tmp_path):
    """Broken links, anchors and pages left out of the nav fail the build (mkdocs.yml's validation)."""
    r = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    built = {p.relative_to(tmp_path / "site").parts[0] for p in (tmp_path / "site").glob("*/index.html")}
    assert {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"} <= built


def test_a_broken_anchor_fails_the_strict_build(tmp_path):
    """The check above has teeth: the same guide with one link to a missing anchor does not build."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / ".mkdocs", tmp_path / ".mkdocs")
    with open(tmp_path / "docs" / "index.md", "a") as f:
        f.write("\n[broken](commands.md#no-such-heading)\n")
    r = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0 and "no-such-heading" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]


def test_the_blocks_marked_for_test_readme_are_the_ones_it_runs():
    from test_readme import quick_start_blocks
    marked = [[command for command, _ in steps(b)] for b in all_blocks()
              if b.marker == "<!-- run by tests/test_readme.py -->"]
    assert marked == [[command for command, _ in block] for block in quick_start_blocks()]
