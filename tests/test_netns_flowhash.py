"""labctl's own ECMP hash (kernels before 6.11, forced here with LABCTL_ECMP_HASH=bpf): real UDP
goes where `labctl route` says, whatever seed the kernel's own hash has, and a seed is a draw."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import require_root
from labctl import lifecycle as labmod
from labctl import state
from labctl.kernel import nsutil, rtnl
from netutil import send_udp, wait_for

ROOT = Path(__file__).resolve().parents[1]
LEAF_SPINE = ROOT / "topologies" / "leaf-spine.yml"
SPORTS = range(49152, 49152 + 32)
PER_FLOW = 20

pytestmark = pytest.mark.netns


@pytest.fixture
def bpf_hash(monkeypatch):
    monkeypatch.setenv("LABCTL_ECMP_HASH", "bpf")


def backend_address(plan, name: str) -> str:
    return next(i.address.split("/")[0] for i in plan.node(name).interfaces if i.fabric == "backend")


def predicted_spines(plan) -> dict[int, str]:
    out = {}
    for sport in SPORTS:
        hops = labmod.trace_path(plan, "srv1-gpu0", "srv2-gpu1", sport, 4791)
        assert [h["node"] for h in hops][0::4] == ["srv1-gpu0", "srv2-gpu1"], hops
        out[sport] = hops[2]["node"]        # gpu -> leaf1 -> spineN -> leaf2 -> gpu
    return out


def measured_spines(plan) -> dict[int, str]:
    """Flow by flow, PER_FLOW datagrams: the spine link of leaf1 that carried them."""
    leaf1, src = plan.node("leaf1"), plan.node("srv1-gpu0")
    dst = backend_address(plan, "srv2-gpu1")
    out = {}
    for sport in SPORTS:
        before = labmod.live_links(leaf1.namespace)

        def sent():
            after = labmod.live_links(leaf1.namespace)
            return {s: after[s]["tx_packets"] - before[s]["tx_packets"] for s in ("spine1", "spine2")}

        send_udp(src.namespace, dst, sport, 4791, b"x" * 1000, PER_FLOW)
        wait_for(lambda: sum(sent().values()) >= PER_FLOW, timeout=10)
        # an ARP packet or two may cross as well: the flow's link is the one that carried all of it
        out[sport] = next((s for s, n in sent().items() if n >= PER_FLOW), f"split {sent()}")
    return out


def kernels_own_choice(plan, sport: int) -> str:
    """Where the kernel's own hash (its seed, not labctl's program) would send this flow at leaf1."""
    leaf1, gpu = plan.node("leaf1"), plan.node("srv1-gpu0")
    with nsutil.netlink_socket(leaf1.namespace) as sock:
        got = rtnl.route_get(sock, backend_address(plan, "srv2-gpu1"), src=backend_address(plan, "srv1-gpu0"),
                             iif=leaf1.iface(gpu.interfaces[0].peer_iface).index, proto=17, sport=sport, dport=4791)
    return next(i.peer_node for i in leaf1.interfaces if i.index == got["oif"])


def test_real_udp_goes_where_route_says_whatever_seed_the_kernel_has(bpf_hash, built_lab):
    require_root()
    plan = built_lab(LEAF_SPINE)
    leaf1 = plan.node("leaf1")
    assert leaf1.flow_hash is not None and leaf1.flow_hash.seed == 1
    assert leaf1.sysctls["net.ipv4.fib_multipath_hash_policy"] == "1"
    predicted = predicted_spines(plan)
    assert set(predicted.values()) == {"spine1", "spine2"}, "32 ports should use both spines"
    assert measured_spines(plan) == predicted
    # the kernel's own hash draws anew (before 6.11 its key is already random): the program's draw stays
    if Path("/proc/sys/net/ipv4/fib_multipath_hash_seed").exists():
        with nsutil.entered(leaf1.namespace):
            nsutil.write_sysctl("net.ipv4.fib_multipath_hash_seed", "3735928559")
    kernel = {sport: kernels_own_choice(plan, sport) for sport in SPORTS}
    assert kernel != predicted, "the kernel's hash under another seed should place some flow elsewhere"
    assert measured_spines(plan) == predicted


def test_another_seed_is_another_draw_and_a_cut_uplink_takes_none(bpf_hash, built_lab, lab_name):
    require_root()
    first = predicted_spines(built_lab(LEAF_SPINE))
    other = built_lab(LEAF_SPINE, ["hash_seed=2"], name=lab_name + "b")
    drawn = predicted_spines(other)
    assert drawn != first and set(drawn.values()) == {"spine1", "spine2"}
    assert measured_spines(other) == drawn
    lab = state.lab_dir(other.lab)
    labmod.set_link_state(lab, other, other.node("leaf1"), "spine1", up=False)
    assert set(predicted_spines(other).values()) == {"spine2"}
    assert measured_spines(other) == {s: "spine2" for s in SPORTS}
