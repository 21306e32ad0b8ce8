"""Reading a Mininet topology file (topology/sources.py and mininet_topo.py), as a Mininet user's
files are: their own output passes through, their errors point at their own lines, what they
leave running is stopped, what labctl does not carry over is said, and a file root does not own
alone is not run as root without --trust. Runs Debian's Mininet under /usr/bin/python3."""
from __future__ import annotations

import os
import time

import pytest

from labctl.errors import InputError
from labctl.topology import sources

HEAD = "from mininet.topo import Topo\n"
TWO_HOSTS = "class T(Topo):\n    def build(self):\n        self.addLink(self.addHost('h1'), self.addHost('h2'))\n"


def topo_file(tmp_path, body: str, name: str = "t.py"):
    f = tmp_path / name
    f.write_text(HEAD + body)
    return f


def test_the_files_own_prints_pass_through_and_do_not_break_the_reading(tmp_path, capfd):
    f = topo_file(tmp_path, "print('hello from import')\nclass T(Topo):\n    def build(self):\n"
                  "        print('building')\n        self.addLink(self.addHost('h1'), self.addHost('h2'))\n"
                  "topos = {'t': T}\n")
    text = sources.render(str(f), topo="t")
    assert "h1:" in text and "h2:" in text
    err = capfd.readouterr().err
    assert "hello from import" in err and "building" in err


@pytest.mark.parametrize("body, line, what", [
    ("class T(Topo):\n    def build(self):\n        self.addHost('h1'\n", 4, "SyntaxError"),
    ("class T(Topo):\n    def build(self):\n        raise ValueError('bad n')\ntopos = {'t': T}\n", 4, "ValueError: bad n"),
    ("def helper():\n    return 1 / 0\nclass T(Topo):\n    def build(self):\n        helper()\ntopos = {'t': T}\n",
     3, "ZeroDivisionError"),                                             # the deepest frame in the file
    ("import no_such_module_here\n", 2, "ModuleNotFoundError"),
    ("import sys\nsys.exit(0)\n", None, "called exit(0)"),
])
def test_the_files_own_errors_point_at_its_own_lines(tmp_path, body, line, what):
    f = topo_file(tmp_path, body)
    with pytest.raises(InputError) as exc:
        sources.render(str(f), topo="t")
    assert what in str(exc.value), str(exc.value)
    assert exc.value.where.file == str(f) and exc.value.where.line == line, exc.value.where
    assert "Mininet is installed" not in (exc.value.fix or "")


def test_a_name_the_file_lacks_is_listed_with_those_it_has(tmp_path):
    f = topo_file(tmp_path, "class Mine(Topo):\n    def build(self):\n        self.addHost('h1')\n")
    with pytest.raises(InputError, match="no topology 'other' in .*there are Mine, linear, single, tree"):
        sources.render(str(f), topo="other")


def test_what_the_file_leaves_running_is_stopped_even_if_it_detached(tmp_path):
    plain, detached = tmp_path / "plain", tmp_path / "detached"
    f = topo_file(tmp_path, "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 3; touch %s'])\n"
                  "subprocess.Popen(['sh', '-c', 'sleep 3; touch %s'], start_new_session=True)\n"
                  % (plain, detached) + TWO_HOSTS)
    sources.render(str(f), topo="T")
    time.sleep(4)
    assert not plain.exists(), "a child the file started outlived the reading"
    if os.geteuid() == 0:          # as root the reader is PID 1 of its own PID namespace
        assert not detached.exists(), "a child in a session of its own outlived the reading"


def test_a_forked_child_or_bytes_that_are_not_text_do_not_confuse_the_reading(tmp_path):
    f = topo_file(tmp_path, "import os, sys\nos.write(2, b'\\xff\\xfe not text\\n')\n"
                  "if os.fork() == 0:\n    sys.exit(0)\nos.wait()\n" + TWO_HOSTS)
    text = sources.render(str(f), topo="T")
    assert "h1:" in text and "h2:" in text


def test_what_the_file_names_cannot_write_the_lab_file(tmp_path):
    """Option names land in the rendered file's comments: a newline in one must not add lab keys."""
    f = topo_file(tmp_path, "class T(Topo):\n    def build(self):\n"
                  "        h = self.addHost('h1', **{'ip\\nrouting:\\n  hash_seed: 7\\n#': 1})\n"
                  "        self.addLink(h, self.addHost('h2'))\n")
    text = sources.render(str(f), topo="T")
    assert "\nrouting:" not in text, text
    assert not [line for line in text.splitlines() if line.startswith("  hash_seed")], text


def test_two_names_that_differ_only_in_case_are_refused(tmp_path):
    f = topo_file(tmp_path, "class T(Topo):\n    def build(self):\n        self.addLink(self.addHost('H1'), "
                  "self.addHost('h1'))\n")
    with pytest.raises(InputError, match="are both 'h1' in labctl"):
        sources.render(str(f), topo="T")


def test_a_lab_file_or_sets_with_topo_are_refused(tmp_path):
    yml = tmp_path / "lab.yml"
    yml.write_text("name: x\n")
    with pytest.raises(InputError, match="not one"):
        sources.render(str(yml), topo="t")
    with pytest.raises(InputError, match="--set and --templates are for labctl lab files"):
        sources.render(None, sets=["defaults.rate=10G"], topo="linear,2")


def test_upper_case_names_and_what_is_not_carried_over_are_noted(tmp_path):
    f = topo_file(tmp_path, "class T(Topo):\n    def build(self):\n        r = self.addHost('R0', ip='192.168.1.1/24')\n"
                  "        c = self.addHost('Client')\n        s = self.addSwitch('s1')\n"
                  "        self.addLink(r, s, intfName1='r0-eth1')\n"
                  "        from mininet.link import TCLink\n        self.addLink(c, s, cls=TCLink, bw=10)\n")
    text = sources.render(str(f), topo="T")
    assert "cls" not in text, text          # a TCLink's bw is carried: its class is no loss
    assert "# note: node 'R0' is 'r0' here" in text and "# note: node 'Client' is 'client' here" in text
    assert "# note: r0: ip not carried over" in text
    assert "# note: link r0-s1: intfName1 not carried over" in text
    assert "r0:" in text and "client:" in text


def test_a_file_root_does_not_own_alone_is_not_run_as_root_without_trust(tmp_path):
    marker = tmp_path / "ran"
    f = topo_file(tmp_path, f"open({str(marker)!r}, 'w').write('x')\n" + TWO_HOSTS)
    os.chmod(f, 0o666)
    if os.geteuid() == 0:
        # a directory above it that someone else may write is as bad: they could swap the file's
        # directory for another between the check and the run
        sub = tmp_path / "d"
        sub.mkdir()
        g = sub / "t.py"
        g.write_text(f.read_text())
        os.chmod(tmp_path, 0o777)
        try:
            with pytest.raises(InputError, match=f"{tmp_path} is writable by others"):
                sources.render(str(g), topo="T")
        finally:
            os.chmod(tmp_path, 0o700)
        assert not marker.exists()
        with pytest.raises(InputError, match="runs its Python as root, and it is not trusted") as exc:
            sources.render(str(f), topo="T")
        assert "--trust" in exc.value.fix and not marker.exists(), "refused before it ran"
    sources.render(str(f), topo="T", trust=True)
    assert marker.exists()


def test_a_delay_without_a_unit_is_read_as_tc_reads_it():
    """Mininet hands TCLink's delay to netem, where 5 is 5 us; labctl's bare numbers are seconds,
    so delay=5 was refused as over a second and delay=0.5 taken as 500 ms."""
    import yaml
    mn = {"hosts": ["h1", "h2"], "switches": ["s1"],
          "links": [{"a": "h1", "b": "s1", "delay": 5}, {"a": "s1", "b": "h2", "delay": "2ms", "jitter": "0.5"}]}
    text = sources._lab_yaml(mn, None, "t", "mut")
    links = yaml.safe_load(text)["links"]
    assert [lk.get("latency") for lk in links] == ["5us", "2ms"] and links[1]["jitter"] == "0.5us"
    assert "delay 5 has no unit" in text and "reads microseconds" in text
