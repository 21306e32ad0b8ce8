"""WAN traffic engineering on real namespaces: a router's te: rules, read back from its ports'
counters. tests/topologies/te.yml has two WAN paths from r1 to r2 (1 km and 10 km); r1 pins RoCE
data (DSCP 26) to the short one and spreads UDP to port 5201 over both at 3:1, and hashes the rest
over both as ECMP does. The model's hash (plan/flowhash.py) says which path each flow takes.
docs/wan.md quotes the `labctl route` lines test_route_names_the_rule_and_its_path runs."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import require_root
from labctl import lifecycle as labmod
from labctl import state
from labctl.cli import cli
from labctl.kernel import nsutil, rtnl
from labctl.plan.flowhash import hash32, select

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests" / "topologies" / "te.yml"
PAYLOAD = 1000
FLOWS, PACKETS = 200, 4                # 800 packets a phase: 0.8 MB, under every queue's buffer
pytestmark = pytest.mark.netns


def ip(a: str) -> int:
    return int.from_bytes(socket.inet_aton(a), "big")


def tx_bytes(node) -> dict[str, int]:
    with nsutil.netlink_socket(node.namespace) as sock:
        links = rtnl.link_dump(sock)
    return {name: links[name]["tx_bytes"] for name in ("r2", "r2-2")}


def send(namespace: str, dst: str, dscp: int, dport: int, sports: range) -> None:
    """PACKETS datagrams from each source port, with `dscp`; paced so that h1's own queue (400
    Mbit/s) never fills."""
    with nsutil.entered(namespace):
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in sports]
    try:
        for s, sport in zip(socks, sports):
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
            s.bind(("0.0.0.0", sport))
        for _ in range(PACKETS):
            for s in socks:
                s.sendto(bytes(PAYLOAD), (dst, dport))
            time.sleep(0.01)
    finally:
        for s in socks:
            s.close()


def phase(plan, dscp: int, dport: int, sports: range) -> dict[str, int]:
    """Bytes r1 sent on each WAN port while h1 sent these flows, once the queues drained."""
    r1 = plan.node("r1")
    before = tx_bytes(r1)
    send(plan.node("h1").namespace, plan.node("h2").interfaces[0].address.split("/")[0], dscp, dport, sports)
    last, now = None, tx_bytes(r1)
    while now != last:                     # the long path's queue drains at 100 Mbit/s
        time.sleep(0.2)
        last, now = now, tx_bytes(r1)
    return {p: now[p] - before[p] for p in now}


def predicted(plan, dport: int, sports: range, weights: list[int]) -> dict[str, float]:
    """The share of flows the model's hash puts on each path (r2, r2-2) under `weights`."""
    fh = plan.node("r1").flow_hash
    src = plan.node("h1").interfaces[0].address.split("/")[0]
    dst = plan.node("h2").interfaces[0].address.split("/")[0]
    picks = [select(hash32(fh, ip(src), ip(dst), 17, s, dport), weights, [True, True]) for s in sports]
    return {"r2": picks.count(0) / len(picks), "r2-2": picks.count(1) / len(picks)}


def test_te_pins_a_class_and_weights_a_port_by_the_counters(built_lab):
    """RoCE data: every byte on the short path (the long one sees under 1% of what was sent: a
    stray neighbour message is all it may carry). UDP to 5201: 3:1 within 10% of the weights'
    share, and within 3 points of the model's hash. Unsteered UDP: ECMP over both paths, as the
    model's hash says (within 3 points): the rule, not the lab, keeps RoCE off the long path."""
    require_root()
    plan = built_lab(LAB)
    sent = FLOWS * PACKETS * PAYLOAD

    roce = phase(plan, 26, 4791, range(40000, 40000 + FLOWS))
    assert roce["r2"] >= sent, roce
    assert roce["r2-2"] < 0.01 * sent, roce

    weighted = phase(plan, 0, 5201, range(41000, 41000 + FLOWS))
    share = weighted["r2"] / (weighted["r2"] + weighted["r2-2"])
    assert share == pytest.approx(0.75, rel=0.10), weighted
    assert share == pytest.approx(predicted(plan, 5201, range(41000, 41000 + FLOWS), [3, 1])["r2"], abs=0.03)

    ecmp = phase(plan, 0, 4791, range(42000, 42000 + FLOWS))
    share = ecmp["r2"] / (ecmp["r2"] + ecmp["r2-2"])
    model = predicted(plan, 4791, range(42000, 42000 + FLOWS), [1, 1])["r2"]
    assert share == pytest.approx(model, abs=0.03), (ecmp, model)
    assert 0.2 < share < 0.8, "unsteered traffic takes both paths"


def test_route_names_the_rule_and_its_path(built_lab):
    """`labctl route` says which rule steered a flow and where; a flow no rule matches is ECMP's,
    and the path it names is the model hash's pick."""
    require_root()
    plan = built_lab(LAB)
    for sport in range(49152, 49160):
        hops = labmod.trace_path(plan, "h1", "h2", sport, 4791)       # RoCE data: DSCP 26
        r1 = next(h for h in hops if h["node"] == "r1")
        assert r1["out"] == "r2" and "te rule 1: class roce -> path r2" in r1["why"], r1
    outs = set()
    for sport in range(49152, 49168):
        hops = labmod.trace_path(plan, "h1", "h2", sport, 5201, dscp=0)
        r1 = next(h for h in hops if h["node"] == "r1")
        assert "te rule 2" in r1["why"] and "r2 x3, r2-2 x1" in r1["why"], r1
        want = ["r2", "r2-2"][round(1 - predicted(plan, 5201, range(sport, sport + 1), [3, 1])["r2"])]
        assert r1["out"] == want, (sport, r1)
        outs.add(r1["out"])
    assert outs == {"r2", "r2-2"}
    hops = labmod.trace_path(plan, "h1", "h2", 49152, 80, dscp=0)
    assert "why" not in next(h for h in hops if h["node"] == "r1")
    # the guide's block, as written: every line it quotes is printed
    page = (ROOT / "docs" / "wan.md").read_text()
    block = page.split("<!-- run by tests/test_netns_te.py -->", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    ran = 0
    for step in block.split("$ sudo labctl ")[1:]:
        command, *quoted = [line for line in step.splitlines() if line.strip()]
        result = CliRunner().invoke(cli, command.split("#")[0].split())
        assert result.exit_code == 0, result.output
        for line in quoted:
            assert line in result.output.splitlines(), (command, line, result.output)
        ran += 1
    assert ran == 2


def test_a_cut_pinned_path_fails_over_and_comes_back(built_lab):
    """With the short path cut, the pinned class takes the long one (its rule's table has no
    route left, so main's decides) and the counters say so; restored, the rule pins it again."""
    require_root()
    plan = built_lab(LAB)
    lab = state.lab_dir(plan.lab)
    sent = FLOWS * PACKETS * PAYLOAD
    labmod.set_link_state(lab, plan, plan.node("r1"), "r2", up=False)
    r1 = next(h for h in labmod.trace_path(plan, "h1", "h2", 49152, 4791) if h["node"] == "r1")
    assert r1["out"] == "r2-2" and "why" not in r1, r1
    cut = phase(plan, 26, 4791, range(43000, 43000 + FLOWS))
    assert cut["r2-2"] >= sent and cut["r2"] == 0, cut
    labmod.set_link_state(lab, plan, plan.node("r1"), "r2", up=True)
    r1 = next(h for h in labmod.trace_path(plan, "h1", "h2", 49152, 4791) if h["node"] == "r1")
    assert r1["out"] == "r2" and "te rule 1" in r1["why"], r1
    back = phase(plan, 26, 4791, range(44000, 44000 + FLOWS))
    assert back["r2"] >= sent and back["r2-2"] < 0.01 * sent, back
