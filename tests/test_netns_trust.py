"""The trust model at `up`, on real namespaces: an untrusted lab file with an exec line on the
host or a bind creates nothing and names its lines; with --trust the same file comes up and its
exec line runs; a bind of / or of a container runtime's socket is refused even with --trust.
A privileged node and added capabilities, on a real Docker engine: untrusted, nothing is made;
with --trust the node alone is privileged (or, where root lacks a capability, the node is refused
before anything is made), a cap_add node alone holds its extra capability, and the containers
that are not privileged run with no_new_privs, FRR included."""
from __future__ import annotations

import subprocess

import pytest

from conftest import lab_namespaces
from labctl import lifecycle as labmod
from labctl import state
from labctl import capabilities as caps
from labctl.errors import InputError, LabError

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


PRIV_LAB = """name: tt
nodes:
  sw: {kind: switch, fabric: backend}
  a: {kind: host, image: labctl/host, cmd: "sleep infinity", privileged: true}
  b: {kind: host, image: labctl/host, cmd: "sleep infinity", cap_add: [SYS_PTRACE]}
  c: {kind: host, image: labctl/frr, cmd: "sleep infinity", exec: ["/usr/lib/frr/frrinit.sh start"]}
links:
  - endpoints: [a, sw]
  - endpoints: [b, sw]
  - endpoints: [c, sw]
"""
PTRACE = caps.CAPABILITIES.index("SYS_PTRACE")


def lab_containers(client, lab: str) -> list[str]:
    return [c.name for c in client.containers.list(all=True, filters={"label": f"labctl.lab={lab}"})]


def assert_nothing_made(client, lab: str) -> None:
    assert lab_containers(client, lab) == []
    assert lab_namespaces(lab + "-") == [] and not state.lab_dir(lab).path.exists()


def status_of(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}


def test_an_untrusted_privileged_node_makes_nothing_and_names_its_lines(docker_engine, state_dir, lab_name,
                                                                        tmp_path):
    f = writable_lab(tmp_path, PRIV_LAB)
    with pytest.raises(InputError) as exc:
        labmod.up(str(f), name=lab_name)
    msg = str(exc.value)
    assert "lab.yml:4: nodes.a.privileged: privileged: true" in msg, msg
    assert "lab.yml:5: nodes.b.cap_add[0]: capability: SYS_PTRACE" in msg, msg
    assert "--trust" in exc.value.fix and "chmod go-w" in exc.value.fix
    assert_nothing_made(docker_engine, lab_name)


def test_trusted_only_the_node_that_asks_is_privileged_or_gets_its_capability(docker_engine, state_dir, lab_name,
                                                                               tmp_path):
    f = writable_lab(tmp_path, PRIV_LAB)
    lacking = caps.lacking()
    if lacking:
        # runc cannot give a privileged container a capability its creator lacks (SYS_RESOURCE
        # in a restricted sandbox): refused, naming it, before a namespace or container exists
        with pytest.raises(LabError, match=f"lacks {lacking[0]}"):
            labmod.up(str(f), name=lab_name, trust=True)
        assert_nothing_made(docker_engine, lab_name)
        f.write_text(PRIV_LAB.replace(", privileged: true", ""))   # the rest of the lab, to check it
    plan, lab, _ = labmod.up(str(f), name=lab_name, trust=True)
    try:
        ctrs = {n.name: docker_engine.containers.get(n.container.name) for n in plan.nodes if n.container}
        privileged = {name: c.attrs["HostConfig"]["Privileged"] for name, c in ctrs.items()}
        assert privileged == {"a": not lacking, "b": False, "c": False}, privileged
        for name, c in ctrs.items():
            init = status_of(c.attrs["State"]["Pid"])
            has_ptrace = bool(int(init["CapEff"], 16) >> PTRACE & 1)
            assert has_ptrace == (name == "b" or privileged[name]), (name, init["CapEff"])
            assert init["NoNewPrivs"] == ("0" if privileged[name] else "1"), (name, init["NoNewPrivs"])
            assert ("no-new-privileges" in (c.attrs["HostConfig"]["SecurityOpt"] or [])) == (not privileged[name])
        if privileged["a"]:
            assert int(status_of(ctrs["a"].attrs["State"]["Pid"])["CapEff"], 16) == \
                int(status_of(1)["CapBnd"], 16), "a privileged node holds every capability root holds"
        # FRR under no_new_privs: zebra started by the exec line (which enters with the flag too) and answers
        c = plan.node("c")
        r = subprocess.run(labmod.backend_of(lab).exec_argv(c, ["sh", "-c", "grep NoNewPrivs /proc/$(pgrep -xo zebra)"
                                                                "/status && vtysh -c 'show version'"]),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "NoNewPrivs:\t1" in r.stdout and "FRRouting" in r.stdout, (r.stdout, r.stderr)
        tried, failed = labmod.pingall(plan)
        assert tried and not failed, failed
    finally:
        labmod.down(lab_name)
    assert_nothing_made(docker_engine, lab_name)
