"""pingall's verdict (pure logic: the pings are stood in for): a pair that did not answer is asked
again, up to PING_TRIES pings one after another, and only a pair that answered none fails."""
from __future__ import annotations

from pathlib import Path

from labctl.lifecycle import reach
from labctl.plan.compile import compile_plan
from labctl.topology.load import load_topology

ROOT = Path(__file__).resolve().parents[1]


def test_a_pair_fails_only_when_every_try_went_unanswered(monkeypatch):
    plan = compile_plan(load_topology(ROOT / "topologies" / "leaf-spine.yml"))
    pairs = reach.ping_pairs(plan)
    slow, dead = (pairs[0][0].name, pairs[0][2].address), (pairs[1][0].name, pairs[1][2].address)
    asked = []

    def ping_all(backend, batch, parallel):
        asked.append(len(batch))
        tries = len(asked)
        return [(a, b, bi, not ((a.name, bi.address) == dead or ((a.name, bi.address) == slow and tries < 3)))
                for a, b, bi in batch]

    monkeypatch.setattr(reach, "_ping_all", ping_all)
    monkeypatch.setattr(reach, "require_root", lambda what: None)
    tried, failed = reach.pingall(plan, backend=object())
    assert (tried, failed) == (len(pairs), [(pairs[1][0].name, pairs[1][1].name)])
    assert asked == [len(pairs), 2, 2]                  # everyone once, then only those that did not answer
    asked.clear()
    monkeypatch.setattr(reach, "_ping_all", lambda backend, batch, parallel: asked.append(len(batch)) or
                        [(a, b, bi, True) for a, b, bi in batch])
    assert reach.pingall(plan, backend=object()) == (len(pairs), []) and asked == [len(pairs)]
