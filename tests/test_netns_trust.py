"""The trust model at `up`, on real namespaces: an untrusted lab file with an exec line on the
host or a bind creates nothing and names its lines; with --trust the same file comes up and its
exec line runs; a bind of / or of a container runtime's socket is refused even with --trust."""
from __future__ import annotations

import subprocess

import pytest

from conftest import lab_namespaces
from labctl import lifecycle as labmod
from labctl import state
from labctl.errors import InputError

pytestmark = pytest.mark.netns
EXEC_LAB = """name: tt
nodes:
  a: {kind: host, exec: ["ip link set dev lo mtu 1280"]}
  b: {kind: host}
links:
  - endpoints: [a, b]
"""


def writable_lab(tmp_path, text: str):
    f = tmp_path / "lab.yml"
    f.write_text(text)
    f.chmod(0o666)               # anyone on the machine could have written it
    return f


def test_untrusted_exec_line_makes_nothing_and_trust_runs_it(state_dir, lab_name, tmp_path):
    f = writable_lab(tmp_path, EXEC_LAB)
    with pytest.raises(InputError) as exc:
        labmod.up(str(f), name=lab_name)
    assert "ip link set dev lo mtu 1280" in str(exc.value) and "--trust" in exc.value.fix
    assert lab_namespaces(lab_name + "-") == [] and not state.lab_dir(lab_name).path.exists()
    plan, lab, _ = labmod.up(str(f), name=lab_name, trust=True)
    try:
        out = subprocess.run(["ip", "-n", plan.node("a").namespace, "link", "show", "lo"], capture_output=True,
                             text=True, check=True).stdout
        assert "mtu 1280" in out, "the trusted exec line ran"
    finally:
        labmod.down(lab_name)
    assert lab_namespaces(lab_name + "-") == []


@pytest.mark.parametrize("bind, message", [("/:/host", "mounts the host's / tree"),
                                           ("/run/docker.sock:/var/run/docker.sock", "container runtime")])
def test_a_bind_of_the_host_root_or_a_runtime_socket_is_refused_even_with_trust(state_dir, lab_name, tmp_path,
                                                                               bind, message):
    f = writable_lab(tmp_path, f"name: tt\nnodes:\n  a: {{kind: host, image: labctl/host, binds: [\"{bind}\"]}}\n"
                               "  b: {kind: host}\nlinks:\n  - endpoints: [a, b]\n")
    with pytest.raises(InputError, match=message):
        labmod.up(str(f), name=lab_name, trust=True)
    assert lab_namespaces(lab_name + "-") == [] and not state.lab_dir(lab_name).path.exists()
