"""`labctl down FILE` finds the lab from the records of what each lab was built from (no root):
a Mininet .py is never read again, a file's name: is believed only for a lab built from it."""
from __future__ import annotations

import pytest

from labctl import state
from labctl.errors import LabError
from labctl.lifecycle.labs import find_lab


def test_a_lab_is_found_by_the_file_its_record_names(state_dir, tmp_path):
    mn = tmp_path / "mytopo.py"
    mn.write_text("raise SystemExit('never run')\n")
    mine, other = tmp_path / "mine.yml", tmp_path / "other.yml"
    mine.write_text("name: demo\nnodes: {a: {kind: host}}\n")
    other.write_text("name: demo\nnodes: {a: {kind: host}}\n")
    state.claim("mn-lab", {}, str(mn.resolve()))
    assert find_lab(str(mn)).name == "mn-lab"
    # mine.yml says `name: demo`, but lab demo was built from other.yml, and mine.yml as lab a
    state.claim("demo", {}, str(other.resolve()))
    with pytest.raises(LabError, match="was built from"):
        find_lab(str(mine))
    state.claim("a", {}, str(mine.resolve()))
    assert find_lab(str(mine)).name == "a"
    mine.write_text("not: [valid yaml\n")          # edited after up: the record still finds it
    assert find_lab(str(mine)).name == "a"
    state.claim("b", {}, str(mine.resolve()))
    with pytest.raises(LabError, match="2 labs were built from"):
        find_lab(str(mine))
