"""A `labctl/` folder planted in the working directory never runs: every labctl process labctl
starts imports labctl from its install (`python -P`), whichever command starts it."""
from __future__ import annotations

import cmd
import io
import re
from pathlib import Path

LABCTL = Path(__file__).resolve().parents[1] / "labctl"


def plant(tmp_path: Path) -> Path:
    marker = tmp_path / "planted-code-ran"
    pkg = tmp_path / "labctl"
    pkg.mkdir()
    payload = f"open({str(marker)!r}, 'w').write('ran')\n"
    (pkg / "__init__.py").write_text(payload)
    (pkg / "__main__.py").write_text(payload)
    return marker


def test_the_prompts_labctl_commands_ignore_a_planted_package(tmp_path, monkeypatch):
    from labctl.cli.prompt import Prompt
    marker = plant(tmp_path)
    monkeypatch.chdir(tmp_path)
    p = Prompt.__new__(Prompt)
    cmd.Cmd.__init__(p, stdout=io.StringIO())
    p.failed = False
    p._labctl(["--version"])
    assert not marker.exists(), "the planted labctl/ ran"
    assert "labctl" in p.stdout.getvalue() and not p.failed, p.stdout.getvalue()


def test_every_python_labctl_starts_is_started_with_dash_p():
    """No `python -m` of labctl's own without -P anywhere in the package."""
    wrong = []
    for path in LABCTL.rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r'"-m",', line) and "sys.executable" in line and '"-P"' not in line:
                wrong.append(f"{path}:{n}: {line.strip()}")
    assert not wrong, "\n".join(wrong)
