"""Why a run was slow (traffic/causes.py): each cause with its share, from the run's own counters.
Pure logic, no root."""
from __future__ import annotations

from labctl.traffic import causes
from labctl.traffic.placement import collision_note


def doc(time_s: float, bandwidth_s: float, hops=None) -> dict:
    d = {"results": [{"time_s": time_s, "ideal_s": bandwidth_s + 0.01,
                      "bound": {"bandwidth_s": bandwidth_s, "alpha_s": 0.01, "propagation_s": 0.0},
                      "per_rank": {"0": {"bytes_sent": 10_000_000}, "1": {"bytes_sent": 10_000_000}}}],
         "ranks": [0, 1], "loss_ledger": {"total": 0}}
    if hops is not None:
        d["ring_placement"] = {"hops": hops, "note": collision_note(hops)}
    return d


def hop(a: str, b: str, spine: str) -> dict:
    return {"from": a, "to": b, "spine": spine, "sport": 49152, "links": [f"leaf1:{spine}"]}


def test_a_collision_explains_its_share_and_the_cpu_is_not_blamed_for_it(tmp_path):
    # two ring hops on one spine: the ring takes twice its bandwidth time, all of it ECMP's
    hops = [hop("g0", "g4", "spine1"), hop("g1", "g5", "spine1"), hop("g2", "g6", "spine2")]
    out = causes.explain(doc(2.02, 1.0, hops), tmp_path / "none.csv")
    assert out is not None and len(out["causes"]) == 1, out
    assert out["causes"][0].startswith("ECMP collision, about 1.00 s (50% of the run): ECMP put ring hops"), out
    # the same run with more time than the collision accounts for: the rest is named too
    out = causes.explain(doc(3.0, 1.0, hops), tmp_path / "none.csv")
    assert [c.split(":")[0] for c in out["causes"]] == ["ECMP collision, about 1.00 s (33% of the run)",
                                                       "the CPU ceiling of this machine"], out
    assert "the other 0.99 s (33% of the run)" in out["causes"][1]


def test_no_collision_no_ecmp_cause(tmp_path):
    hops = [hop("g0", "g4", "spine1"), hop("g1", "g5", "spine2")]
    out = causes.explain(doc(2.0, 1.0, hops), tmp_path / "none.csv")
    assert [c.split(":")[0] for c in out["causes"]] == ["the CPU ceiling of this machine"], out


def test_pauses_count_the_run_alone_not_the_lab_since_up(tmp_path):
    csv = tmp_path / "queues.csv"
    csv.write_text("t_s,node,port,class,tc,depth_bytes,sent_bytes,sent_packets,drops,ecn_marked,pfc_tx,pfc_rx,paused_s\n"
                   "0.0,leaf1,g0,roce,3,0,0,0,0,0,500,0,47.0\n"
                   "0.5,leaf1,g0,roce,3,0,0,0,0,0,560,0,47.25\n"
                   "0.0,leaf1,g1,roce,3,0,0,0,0,0,10,0,1.0\n"
                   "0.5,leaf1,g1,roce,3,0,0,0,0,0,12,0,1.5\n")
    assert causes.pauses(csv) == (62, 0.5)
    out = causes.explain(doc(2.0, 1.0), csv)
    assert "pauses: 62 PFC frames sent; the longest-held class waited 0.50 s" in out["causes"], out


def test_the_collision_is_never_more_than_the_run_lost_and_a_hop_counts_once(tmp_path):
    # a hop that crosses several spines (a zone's spine, then its DCI) is listed once per spine,
    # with the same links: it shares them with no one
    one = {"from": "z1-g1", "to": "z2-g0", "sport": 49152, "links": ["z1-dci1:z2-dci1"]}
    out = causes.explain(doc(2.0, 1.0, [dict(one, spine=s) for s in ("z1-spine1", "z1-dci1", "z2-dci1")]),
                         tmp_path / "none.csv")
    assert not any(c.startswith("ECMP") for c in out["causes"]), out
    # three hops on one link would stretch 2 s of bandwidth time; the run lost only 0.59 s
    hops = [hop("g0", "g4", "spine1"), hop("g1", "g5", "spine1"), hop("g2", "g6", "spine1")]
    out = causes.explain(doc(1.6, 1.0, hops), tmp_path / "none.csv")
    assert out["causes"][0].startswith("ECMP collision, about 0.59 s (37% of the run)"), out


def test_a_train_report_says_where_each_dimension_went_and_flags_tp_off_nvlink():
    from labctl.traffic.report import dimension_lines
    inside = {"tp": {"scaleup": 8_589_824}, "pp": {"scaleout": 536_864}, "dp": {"scaleacross": 3_238_000}, "ep": {}}
    lines = dimension_lines(inside)
    assert lines == ["# where each dimension went: tp scaleup 8,589,824; pp scaleout 536,864; dp scaleacross 3,238,000"]
    # [dp, pp, tp] on a leaf-spine: tp's groups span servers, and most of its bytes leave NVLink
    spread = {"tp": {"scaleup": 3_774_864, "scaleout": 8_589_824}, "dp": {"scaleup": 1_000}}
    lines = dimension_lines(spread)
    assert len(lines) == 2 and lines[1].startswith("# note: 69% of tp's bytes cross scaleout, a fabric tp is not "
                                                   "meant for (tp on scaleup)"), lines
    assert dimension_lines({"ep": {"scaleacross": 10}})[1].startswith("# note: 100% of ep's bytes cross scaleacross")


def test_a_timed_out_operation_is_named_and_not_blamed_on_the_cpu(tmp_path):
    d = doc(6.0, 1.0)
    d["results"][0]["timed_out"] = True
    out = causes.explain(d, tmp_path / "none.csv")
    names = [c.split(":")[0] for c in out["causes"]]
    assert names == ["timed out"], out
    assert "about 4.99 s beyond their bound" in out["causes"][0], out


def test_go_back_n_resends_are_charged_their_payload_share_of_the_ports_time(tmp_path):
    """100 frames of 4 KB resent over 20 MB of operations on a 1 s bandwidth bound: their payload
    crosses the ports again, 409,600 / 20,000,000 of that second; the rest is still named."""
    from labctl.traffic.roce import FRAME_OVERHEAD
    d = doc(2.0, 1.0)
    d["loss_ledger"]["total"] = 100
    d["reordering"] = {"retransmitted_packets": 100, "retransmitted_bytes": 100 * (4096 + FRAME_OVERHEAD)}
    out = causes.explain(d, tmp_path / "none.csv")
    loss = out["causes"][0]
    assert loss.startswith("loss: 100 packets dropped (loss ledger); go-back-N resent 409,600 payload bytes"), loss
    assert "about 0.02 s at the ports' rate" in loss, loss
    assert out["causes"][1].startswith("the CPU ceiling of this machine: the other 0.97 s"), out


def test_a_fabric_link_asked_more_than_the_bound_is_named_before_the_cpu(tmp_path):
    """Four QPs hashed 6 of 8 flows onto leaf4:spine1 (21.3 MB at 100 Mbit/s: 1.70 s, the run's
    time) and the account blamed the CPU; so did a port slowed by `tc set --rate`."""
    d = doc(1.70, 1.0)
    d["busiest_uplink"] = {"port": "leaf4:spine1", "bytes": 21_300_000, "rate_bps": 100_000_000, "seconds": 1.704}
    out = causes.explain(d, tmp_path / "none.csv")
    assert [c.split(":")[0] for c in out["causes"]] == ["busiest fabric link"], out
    assert "leaf4:spine1 carried 21.3 MB" in out["causes"][0] and "about 0.69 s" in out["causes"][0], out
    # within the bound, the link is no cause
    d["busiest_uplink"]["seconds"] = 0.9
    assert [c.split(":")[0] for c in causes.explain(d, tmp_path / "none.csv")["causes"]] == \
        ["the CPU ceiling of this machine"]
