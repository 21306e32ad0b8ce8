"""Every command's --help teaches: an example of its use, and a line for each option (no root)."""
from __future__ import annotations

import click
from click.testing import CliRunner

from labctl.cli import cli


def commands(cmd=cli, path=("labctl",)):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from commands(sub, path + (name,))


def has_example(text: str) -> bool:
    """An `Example:` (or `Examples`, `Try it`, ...) heading followed by an indented `labctl ...` line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().rstrip(":").lower().startswith(("example", "try it", "real machines")):
            if any(x.startswith("  ") and "labctl " in x for x in lines[i + 1:i + 8]):
                return True
    return False


def test_every_command_shows_an_example_and_explains_each_option():
    no_example = [" ".join(p) for p, c in commands() if len(p) > 1 and not has_example(c.help or "")]
    no_help = [f"{' '.join(p)} {o.opts[0]}" for p, c in commands() for o in c.params
               if isinstance(o, click.Option) and not o.help]
    assert not no_example, f"--help without an example: {no_example}"
    assert not no_help, f"options without help: {no_help}"


def test_every_help_prints():
    runner = CliRunner()
    for path, _ in commands():
        result = runner.invoke(cli, [*path[1:], "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, (path, result.output)
