"""The bad-input corpus: every file fails with one error naming the file, the line and the fix."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from labctl.cli import cli
from labctl.errors import InputError
from labctl.plan.compile import compile_plan
from labctl.topology.clabmaps import parse
from labctl.topology.load import load_topology

BAD = sorted((Path(__file__).parent / "bad").glob("*.yml"))


def expectations(path: Path) -> tuple[int, str, list[str]]:
    """The line and text the error must give, and the kind maps the file is read with (a third
    header line `# kind-map: KIND=TARGET ...`, for rules that apply to mapped kinds only)."""
    head = path.read_bytes().decode(errors="replace").splitlines()[:3]   # one file is not UTF-8 on purpose
    line = int(re.match(r"# expect-line: (\d+)", head[0]).group(1))
    text = re.match(r"# expect: (.*)", head[1]).group(1)
    kinds = re.match(r"# kind-map: (.*)", head[2])
    return line, text, kinds.group(1).split() if kinds else []


def test_corpus_is_large_enough():
    assert len(BAD) >= 20


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_file_gives_located_error(path):
    line, text, kinds = expectations(path)
    with pytest.raises(InputError) as info:
        compile_plan(load_topology(path, maps=parse(kinds)))
    message = str(info.value)
    assert text in message
    assert str(path) in message
    assert info.value.where.line == line, message
    assert "fix:" in message or "did you mean" in message or "Input should" in message


@pytest.mark.parametrize("path", BAD[:6], ids=[p.stem for p in BAD[:6]])
def test_cli_exits_2_on_bad_input(path, state_dir):
    result = CliRunner().invoke(cli, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output


def test_set_with_unknown_template_var_names_the_option(state_dir):
    root = Path(__file__).resolve().parents[1]
    result = CliRunner().invoke(cli, ["render", str(root / "topologies/leaf-spine.yml"), "--set", "spine=3"])
    assert result.exit_code == 2
    assert "--set: spine" in result.output and "did you mean 'spines'" in result.output
